// What an engine reports of itself: its numbers, each replica's, and a cluster's nodes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

struct EngineStats {
  std::int32_t num_running = 0;
  std::int32_t num_waiting = 0;
  double kv_usage = 0.0;       // fraction of KV blocks held by sequences
  double peak_kv_usage = 0.0;  // since start
  std::int64_t num_preemptions = 0;
  std::int64_t prefix_queried_tokens = 0;
  std::int64_t prefix_hit_tokens = 0;
  std::int64_t num_steps = 0;
  std::int64_t num_step_tokens = 0;     // tokens run through the model
  std::int64_t num_step_sequences = 0;  // sum over steps of sequences in the step
  // Prompt tokens run through the model (prefill chunks; cached ones are not), and tokens
  // sampled: what the log's prompt and generation throughput count.
  std::int64_t num_prompt_tokens = 0;
  std::int64_t num_generated_tokens = 0;
  double step_seconds = 0.0;          // in the worker (forward and sampling)
  std::int64_t num_decode_steps = 0;  // steps that carried decodes only (no prefill)
  double decode_step_seconds = 0.0;   // their time in the worker
  double schedule_seconds = 0.0;      // in the scheduler's own logic
  std::int64_t num_worker_restarts = 0;
  std::int64_t num_live_actors = 0;  // in the engine's actor system (request actors included)
  std::int32_t num_kv_blocks = 0;
  std::int32_t block_size = 0;
  std::int64_t prefix_cache_blocks = 0;  // blocks the prefix cache holds (in use or not)
  // Speculative decoding (vLLM's spec_decode counters): drafts verified (one sequence's
  // proposal in one step), their tokens, the tokens accepted, accepted at each position.
  std::int64_t spec_num_drafts = 0;
  std::int64_t spec_num_draft_tokens = 0;
  std::int64_t spec_num_accepted_tokens = 0;
  std::vector<std::int64_t> spec_num_accepted_tokens_per_pos;

  bool operator==(const EngineStats&) const = default;
};

// One worker of a replica: where it runs and what of the model it holds. A tensor-parallel
// group's ranks and a pipeline's stages are a worker each, in rank (stage) order.
struct ReplicaWorker {
  std::string node;              // its node's name (empty: this process)
  std::int32_t rank = -1;        // its tensor-parallel rank (-1: the model is not split)
  std::int32_t stage = -1;       // its pipeline stage (-1: the replica is not pipelined)
  std::int32_t layer_begin = 0;  // the layers it holds: [layer_begin, layer_end)
  std::int32_t layer_end = 0;

  bool operator==(const ReplicaWorker&) const = default;
};

// One data-parallel replica: its scheduler's numbers and how many requests it took.
struct ReplicaStats {
  std::int32_t index = 0;
  bool up = true;
  // "up"; down: "loading" (a new worker loads, on `node`), "waiting" (for a node to place
  // it on; `node` empty), "unknown" (it did not answer).
  std::string state = "up";
  std::string node;  // where its worker runs (empty: in this process, or none while waiting)
  std::int64_t num_routed = 0;         // requests the router sent it
  std::int64_t num_prefix_routed = 0;  // of those, for the prefix it held
  EngineStats stats;
  std::vector<ReplicaWorker> workers;  // its loaded worker's ranks or stages (none while down)

  bool operator==(const ReplicaStats&) const = default;
};

// How many data-parallel replicas an engine has: up (taking requests), there now, and the
// range they move in. Fixed (--data-parallel-size N): min == max == current. Elastic (a
// range, or auto): replicas come with nodes and go with them; max is
// EngineConfig::kUnboundedReplicas for auto.
struct ReplicaCount {
  std::int32_t up = 0;
  std::int32_t current = 0;
  std::int32_t min = 0;
  std::int32_t max = 0;
  bool elastic = false;

  bool operator==(const ReplicaCount&) const = default;
};

// A node of the cluster as the head sees it.
struct NodeStatus {
  std::string name;
  std::string id;      // CAF's node id: host hash and process id
  std::string device;  // cpu or cuda
  std::int32_t num_cores = 0;
  std::int64_t memory_bytes = 0;
  std::vector<std::string> gpu_names;
  std::vector<std::int64_t> gpu_memory_bytes;
  std::int32_t replica = -1;    // the replica whose worker(s) it runs (-1: none)
  std::string unfit;            // why no replica is placed there (empty: none)
  std::int32_t num_ranks = 0;   // workers (a group's ranks) it runs
  std::int32_t num_slots = 1;   // workers it can run
  std::string collective_host;  // where other nodes' ranks reach its ranks
  bool draining = false;        // its replicas move off; then it is released and exits
};

// What Engine::drain_node did: started the drain, found it draining already, or knows no
// node of that name (or is no cluster's head).
enum class NodeDrain { started, already, unknown };

}  // namespace troupe
