// Builds the backend a worker runs on, for its spec's device: the CPU backend, or
// the CUDA backend where troupe was built with nvcc. The one place that knows the
// backends' concrete types; a node process uses it without an Engine.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/worker_protocol.hpp"
#include "model/backend.hpp"
#include "model/llama_config.hpp"
#include "model/loaded_model.hpp"
#include "model/lora_adapter.hpp"
#include "troupe/config.hpp"

namespace troupe::worker {

// A worker's spec from an engine's settings, for the model at `model_path`.
engine::WorkerSpec spec_for(const EngineConfig& config, std::string model_path,
                            std::int32_t max_model_len);

// With `beside`, a backend that runs only while `beside` does not (a draft model's) and
// shares its threads where both are the CPU's.
Result<std::unique_ptr<model::Backend>> make_backend(const engine::WorkerSpec& spec,
                                                     const model::Backend* beside = nullptr);

// The GPUs this process can use (none without CUDA, a driver or a device): what a node
// announces when it joins a cluster.
struct GpuInfo {
  std::string name;
  std::int64_t memory_bytes = 0;
};
std::vector<GpuInfo> list_gpus();

// Whether the spec's device can run a model of this shape (the CUDA kernels' limits).
Result<void> check_model(const engine::WorkerSpec& spec, const model::LlamaConfig& config);

// How a rank of a tensor-parallel group (spec.world_size > 1) meets the others.
struct GroupLink {
  model::RendezvousStore* store = nullptr;   // where the ranks exchange their addresses
  std::string prefix = "tp";                 // the group formation's keys in the store
  std::string host = "127.0.0.1";            // the address the other ranks reach this one on
  std::chrono::milliseconds timeout{30000};  // a rendezvous or collective that takes longer fails
  bool within_node = false;                  // the ranks share a node (a pipeline stage's group)
};

// The communicator of rank spec.rank of spec.world_size on the spec's device.
Result<std::shared_ptr<model::Communicator>> connect_group(const engine::WorkerSpec& spec,
                                                           const GroupLink& link);

// A LoRA adapter file read and checked against the model `m`. The path is read on this
// machine.
Result<std::shared_ptr<const model::LoraAdapter>> read_adapter(const model::LoadedModel& m,
                                                               const std::string& path);

// The model at spec.model_path with its weights on a backend for the spec's device:
// checked first against the spec's fingerprint (when it has one) and the device's
// limits, then loaded (its KV cache not yet allocated). A rank of a group loads its
// shard, with its backend joined to the group through `link`.
// `beside`: as make_backend's; `mapped_beside`: the host memory another model's weights
// already take (a draft model's target's), which this one must fit beside.
Result<model::LoadedModel> open_model(const engine::WorkerSpec& spec,
                                      const GroupLink* link = nullptr,
                                      const model::LoadProgress& progress = {},
                                      const model::Backend* beside = nullptr,
                                      std::int64_t mapped_beside = 0);

}  // namespace troupe::worker
