// Builds the backend a worker runs on, for its spec's device: the CPU backend, or
// the CUDA backend where troupe was built with nvcc. The one place that knows the
// backends' concrete types; a node process uses it without an Engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/worker_protocol.hpp"
#include "model/backend.hpp"
#include "model/llama_config.hpp"
#include "model/loaded_model.hpp"
#include "troupe/engine.hpp"

namespace troupe::worker {

// A worker's spec from an engine's settings, for the model at `model_path`.
engine::WorkerSpec spec_for(const EngineConfig& config, std::string model_path,
                            std::int32_t max_model_len);

Result<std::unique_ptr<model::Backend>> make_backend(const engine::WorkerSpec& spec);

// The GPUs this process can use (none without CUDA, a driver or a device): what a node
// announces when it joins a cluster.
struct GpuInfo {
  std::string name;
  std::int64_t memory_bytes = 0;
};
std::vector<GpuInfo> list_gpus();

// Whether the spec's device can run a model of this shape (the CUDA kernels' limits).
Result<void> check_model(const engine::WorkerSpec& spec, const model::LlamaConfig& config);

// The model at spec.model_path with its weights on a backend for the spec's device:
// checked first against the spec's fingerprint (when it has one) and the device's
// limits, then loaded (its KV cache not yet allocated).
Result<model::LoadedModel> open_model(const engine::WorkerSpec& spec);

}  // namespace troupe::worker
