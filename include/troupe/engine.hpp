// The engine's C++ API: submit a prompt, receive its tokens as a stream of
// events, cancel it. Behind it run the actors (actors/); this header names
// none of them, so callers (the server, the CLI, tests) need no CAF. Its values live in
// their own headers, which the rooms below the facade include instead of this one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "troupe/config.hpp"
#include "troupe/events.hpp"
#include "troupe/result.hpp"
#include "troupe/stats.hpp"

namespace troupe {

namespace text {
class Tokenizer;
}  // namespace text

struct EngineHooks;  // tests only: actors/engine_hooks.hpp

class Engine {
 public:
  // Loads the model and starts the actors.
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config);
  // Tests only: the same, with hooks into the worker (actors/engine_hooks.hpp).
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config,
                                                const EngineHooks& hooks);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Events go to `on_event` on an engine thread (it must not
  // block), ending with one whose `finished` is set. Bad parameters are refused here.
  Result<RequestId> submit(GenerateRequest request, TokenCallback on_event);
  // Ends a request now; its KV blocks are freed in the scheduler's next turn.
  void cancel(RequestId id);

  // Run-time LoRA adapters (`serve --enable-runtime-lora-updating`). A load reads the
  // adapter file at `path` where each worker runs (every replica's, every rank keeping
  // its part), checks it against the model and puts it in a free slot, which it returns
  // (GenerateRequest::lora_adapter). A worker's failure empties the slot everywhere again
  // and is the error, naming the replica (and rank). No free slot (EngineConfig::
  // max_loras): ErrorCode::out_of_range. Blocks until every worker answered.
  Result<std::int32_t> load_lora_adapter(const std::string& path);
  // New requests may no longer name `slot` (ErrorCode::invalid_argument when it holds no
  // adapter); those running with it finish as they would have. The slot is free for a
  // later load once the last of them ended.
  Result<void> unload_lora_adapter(std::int32_t slot);
  // LoRA slots (EngineConfig::max_loras, at least the start-up adapters).
  std::int32_t num_lora_slots() const;
  // The whole engine's numbers (summed over its replicas).
  EngineStats stats() const;
  // Each replica's, in order (one entry without data parallelism).
  std::vector<ReplicaStats> replicas() const;
  // A cluster's nodes (empty without a cluster).
  std::vector<NodeStatus> nodes() const;
  // Drains a cluster's node by name (POST /v1/cluster/nodes/{name}/drain): its replicas
  // take no new requests, move their queued ones, let the running ones finish within the
  // node's --shutdown-timeout (then move them with their tokens); then the node exits.
  NodeDrain drain_node(const std::string& name);
  // Replicas that take requests now (a worker, and no drain), and in all; cheap (no message), for
  // /health.
  std::int32_t num_replicas_up() const;
  // Replicas there now (elastic: they come and go with nodes).
  std::int32_t num_replicas() const;
  // Up, there now, and the range they move in (for /health, /v1/cluster); cheap.
  ReplicaCount replica_count() const;
  // Whether nodes join this engine (EngineConfig::cluster).
  bool is_cluster_head() const;

  const text::Tokenizer& tokenizer() const;
  std::int32_t max_model_len() const;
  // The model's tokenizer.chat_template (empty when it has none).
  const std::string& chat_template() const;
  // What the worker runs on: "CPU, 2 threads, SIMD AVX3", "CUDA NVIDIA H200 (...)".
  const std::string& device_description() const;
  // A replica's weights and KV pool, in bytes, as its worker reported them at load.
  std::int64_t weight_bytes() const;
  std::int64_t kv_cache_bytes() const;
  // How waiting requests are ordered: fcfs, or by GenerateRequest::priority.
  SchedulingPolicy scheduling_policy() const;
  // The token budget as it starts: "2048 tokens per step", or the auto budget with
  // what it measured ("auto, 96 tokens per step beside a decode ...").
  const std::string& token_budget_description() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
