// How an engine is set up: its model, device, KV cache, batching, parallelism and
// cluster. Plain values; every room below the Engine facade may read them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/types.hpp"

namespace troupe {

namespace monitoring {
class Metrics;
class StepEvents;
}  // namespace monitoring

// How waiting requests are ordered: first come, first served, or by
// GenerateRequest::priority (lower is more urgent).
enum class SchedulingPolicy { fcfs, priority };

enum class BatchingMode {
  continuous,    // the batch is re-formed every iteration
  static_batch,  // admit up to max_num_seqs when the batch is empty; run them all to the end
};

// Which data-parallel replica takes a request (engine/router.hpp says how each decides).
enum class RoutingPolicy { prefix, least_loaded, round_robin };

// The head of a cluster: nodes (`troupe node --join`) connect to this port, and each
// replica's worker is placed on one of them.
struct ClusterConfig {
  std::string host = "127.0.0.1";         // where nodes connect; loopback unless told otherwise
  std::uint16_t port = 0;                 // 0: any free one (on_listening says which)
  std::string token;                      // nodes must present it; required off loopback
  std::chrono::seconds wait{60};          // for enough nodes to place every replica
  std::chrono::seconds step_timeout{60};  // a worker slower than this counts as lost
  // A request moved off a lost worker waits this long for a replica to take it (while none
  // is up) before it ends with an error.
  std::chrono::seconds failover_timeout{30};
  // Replica 0's worker runs in the head itself (as vLLM's head node hosts workers); the
  // others wait for nodes.
  bool head_hosts_replica = false;
  std::function<void(std::uint16_t port)> on_listening;  // once the port is open
  // Mutual TLS (PEM files; all three or none): the head and every node present a
  // certificate signed by the `tls_ca` authority, and a peer without one is refused.
  std::string tls_certificate;
  std::string tls_key;
  std::string tls_ca;
  // A connection to the cluster port has this long from its accept until a node joins over
  // it (TLS, CAF's handshake, the join with the token), and at most max_pending_handshakes
  // are that far at once; the others are closed at once.
  std::chrono::milliseconds handshake_timeout{10000};
  int max_pending_handshakes = 32;
  // Descriptors the cluster port leaves free for the rest of the process (troupe serve:
  // the HTTP server's connections); 0: none kept.
  int reserved_descriptors = 0;
};

// Speculative decoding (vLLM's --speculative-config): `ngram` proposes each decoding
// sequence's next tokens by prompt lookup over its own tokens, or a draft model (a GGUF
// with the same vocabulary, run by the worker beside the model) proposes them; the step
// verifies them beside the others. num_speculative_tokens 0: off.
struct SpeculativeConfig {
  std::int32_t num_speculative_tokens = 0;  // k: the most tokens proposed per step
  std::int32_t prompt_lookup_max = 0;       // ngram: the longest n-gram looked up
  std::int32_t prompt_lookup_min = 1;       // ngram: the shortest
  // The draft model's file; empty: ngram. With one, a decode's draft is k placeholders
  // that the worker fills in, after the draft has run the tokens it has not seen.
  std::string draft_model;
  // The draft model's CPU threads: a pool of its own (a small model may run best on fewer
  // threads than the model). 0: the model's own pool. It never runs at the same time as
  // the model either way.
  std::int32_t draft_num_threads = 0;
  // No proposals while more sequences than this are running or waiting: a large batch's
  // step is bound by compute, not by reading the weights once, and verifying k tokens then
  // costs about k tokens (vLLM's speculative_disable_by_batch_size, which counts its queue).
  std::int32_t disable_by_batch_size = 4;
  // The draft model's context length, read from its file by the engine (0: no bound): a
  // sequence that has reached it gets no more proposals, as vLLM stops drafting past the
  // draft's max_model_len (its proposals would come from positions it was never trained on).
  std::int32_t draft_context_length = 0;

  bool enabled() const { return num_speculative_tokens > 0; }
  bool uses_draft_model() const { return !draft_model.empty(); }
  bool operator==(const SpeculativeConfig&) const = default;
};

struct EngineConfig {
  std::string model_path;  // empty: the built-in random model
  int num_threads = 0;     // compute threads (0: all cores)
  Device device = Device::cpu;
  // CUDA: the share of the GPU memory left free by the weights and buffers that the KV pool
  // takes (vLLM's --gpu-memory-utilization); num_kv_blocks, when set, wins.
  double gpu_memory_utilization = 0.9;
  bool cuda_graphs = true;  // CUDA: replay decode steps from graphs (vLLM's --enforce-eager off)
  std::int32_t block_size = 16;
  std::int32_t num_kv_blocks = 0;  // 0: derived from kv_cache_bytes
  std::int64_t kv_cache_bytes = std::int64_t{1} << 30;
  std::optional<KvCacheDtype> kv_cache_dtype;  // unset: the device's default (F16)
  std::int32_t max_num_seqs = 256;
  // Tokens one iteration carries; with auto_token_budget, the most it may carry.
  std::int32_t max_num_batched_tokens = 2048;
  // The budget sized to the machine (Sarathi-Serve): each iteration's budget is chosen
  // from the measured cost of a step (timed at load, then every step), so that a step
  // carrying a prefill chunk beside running decodes stays within target_itl_ms.
  // Continuous batching only.
  bool auto_token_budget = false;
  double target_itl_ms = 150.0;
  // > 0: the step also stays within this multiple of the running decodes' own step (a
  // prefill chunk at most doubles a stream's wait at 2); 0: target_itl_ms alone. An
  // explicit --target-itl-ms sets it to 0.
  double itl_decode_step_multiple = 2.0;
  // > 0, with auto_token_budget: a TPOT objective. Each step beside running streams then
  // carries the most prefill that keeps every stream's time per output token since its
  // first within 90% of it (their slack goes to the queue), instead of the target above.
  double target_tpot_ms = 0.0;
  std::int32_t max_model_len = 0;  // 0: the model's context length
  bool enable_prefix_caching = true;
  SpeculativeConfig speculative;  // off unless num_speculative_tokens > 0
  // LoRA adapter files (llama.cpp's GGUF layout) the workers load beside the model: the
  // i-th is GenerateRequest::lora_adapter i + 1. CPU only for now (tensor parallelism too).
  std::vector<std::string> lora_adapters;
  // LoRA slots, for adapters resident at once: lora_adapters fill the first, and
  // Engine::load_lora_adapter the others. Fewer than lora_adapters: exactly those.
  std::int32_t max_loras = 0;
  SchedulingPolicy policy = SchedulingPolicy::fcfs;
  BatchingMode mode = BatchingMode::continuous;
  // Requests without a seed of their own get one derived from this and their id,
  // so that a whole run repeats (vLLM's --seed). Unset: unseeded requests are random.
  std::optional<std::uint64_t> seed;
  // Where the engine records its Prometheus metrics (none when null).
  std::shared_ptr<monitoring::Metrics> metrics;
  // Where each replica publishes its iterations for viewers (the live page's timeline);
  // nothing is built while no one watches. None when null.
  std::shared_ptr<monitoring::StepEvents> step_events;
  // Data parallelism: this many replicas, each a scheduler with its own worker, model
  // and KV cache, behind a router. Local replicas share num_threads between them.
  std::int32_t data_parallel_size = 1;
  // Elastic data parallelism (a cluster's head only; --data-parallel-size MIN:MAX or auto):
  // at most this many replicas, one started on each node that joins with room while
  // serving, and each leaving with its node (drained or lost); data_parallel_size is then
  // the least the head waits for at start. 0: fixed at data_parallel_size (a spare node
  // stays a standby). kUnboundedReplicas: no cap but the nodes (auto).
  std::int32_t data_parallel_max = 0;
  static constexpr std::int32_t kUnboundedReplicas = 0x7fffffff;
  bool elastic() const { return data_parallel_max != 0; }
  RoutingPolicy routing = RoutingPolicy::prefix;
  // Tensor parallelism: each replica's model split over this many ranks (Megatron-style;
  // vLLM's --tensor-parallel-size), each a worker: threads of this process, or workers on
  // nodes (one node for a group when it has the room). CPU ranks all-reduce over Gloo.
  // A rank lost ends its group's requests as a lost node does, and the group is placed
  // again; a collective that does not finish within collective_timeout is such a loss.
  std::int32_t tensor_parallel_size = 1;
  std::chrono::milliseconds collective_timeout{30000};
  // Pipeline parallelism: each replica's layers cut into this many contiguous stages
  // (vLLM's --pipeline-parallel-size), each a worker placed as a tensor-parallel rank is;
  // the hidden states pass from stage to stage (CPU: Gloo). With tensor_parallel_size T > 1,
  // each stage is a group of T ranks (T x P workers; on a cluster, a stage's on one node).
  std::int32_t pipeline_parallel_size = 1;
  // A pipelined replica's steps in flight at once (micro-batches over disjoint sequences,
  // vLLM's virtual engines): while stage 2 runs one, stage 1 runs the next. 0: one per
  // stage (pipeline_parallel_size); 1: one at a time. An unsplit replica runs one.
  std::int32_t pipeline_steps_in_flight = 0;
  // Each stage's layer count in order (vLLM's VLLM_PP_LAYER_PARTITION); empty: balanced.
  std::vector<std::int32_t> pipeline_layer_partition;
  // Set: this engine is a cluster's head and its replicas' workers run on nodes.
  std::optional<ClusterConfig> cluster;
};

}  // namespace troupe
