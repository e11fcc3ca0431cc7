// The engine's C++ API: submit a prompt, receive its tokens as a stream of
// events, cancel it. Behind it run the actors (actors/); this header names
// none of them, so callers (the server, the CLI, tests) need no CAF.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/result.hpp"
#include "troupe/sampling.hpp"
#include "troupe/types.hpp"

namespace troupe {

namespace text {
class Tokenizer;
}  // namespace text
namespace monitoring {
class Metrics;
class StepEvents;
}  // namespace monitoring

using RequestId = std::uint64_t;

struct EngineHooks;  // tests only: actors/engine_hooks.hpp

enum class BatchingPolicy { fcfs, priority };
enum class BatchingMode { continuous, static_batch };
enum class Device { cpu, cuda };
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
  std::string draft_model;                  // the draft model's file; empty: ngram
  // No proposals in a step with more decoding sequences than this (a big batch is
  // compute-bound: verifying k tokens costs about k tokens there).
  std::int32_t disable_by_batch_size = 4;

  bool enabled() const { return num_speculative_tokens > 0; }
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
  KvCacheType kv_cache_dtype = KvCacheType::automatic;
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
  // i-th is GenerateRequest::lora_adapter i + 1. CPU only, and not split, for now.
  std::vector<std::string> lora_adapters;
  BatchingPolicy policy = BatchingPolicy::fcfs;
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
  RoutingPolicy routing = RoutingPolicy::prefix;
  // Tensor parallelism: each replica's model split over this many ranks (Megatron-style;
  // vLLM's --tensor-parallel-size), each a worker: threads of this process, or workers on
  // nodes (one node for a group when it has the room). CPU ranks all-reduce over Gloo.
  // A rank lost ends its group's requests as a lost node does, and the group is placed
  // again; a collective that does not finish within collective_timeout is such a loss.
  std::int32_t tensor_parallel_size = 1;
  std::chrono::milliseconds collective_timeout{30000};
  // Set: this engine is a cluster's head and its replicas' workers run on nodes.
  std::optional<ClusterConfig> cluster;
};

struct GenerateRequest {
  std::vector<TokenId> prompt;
  SamplingParams params;
  std::vector<std::string> stop;  // stop strings (cut from the output)
  // vLLM's: the output's text shows control tokens (as the vocabulary spells them) unless
  // skip_special_tokens; and the stop string, or the EOS or stop token, that ended it when
  // include_stop_str_in_output.
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  std::int32_t priority = 0;  // lower is more urgent (policy priority)
  // Which LoRA adapter computes it: EngineConfig::lora_adapters[lora_adapter - 1]; 0: the
  // base model. The request's, not SamplingParams': it picks the model, not the draw.
  std::int32_t lora_adapter = 0;
  std::chrono::milliseconds timeout{
      0};  // 0: none; else the request ends with FinishReason::timeout
};

struct TokenLogprobEntry {
  TokenId id = kNoToken;
  float logprob = 0.0f;

  bool operator==(const TokenLogprobEntry&) const = default;
};

// A prompt token's log-probability given the tokens before it (SamplingParams::
// prompt_logprobs): its rank among the vocabulary (1: the most likely) and the n most
// likely tokens at its position.
struct PromptLogprob {
  TokenId token = kNoToken;
  float logprob = 0.0f;
  std::int32_t rank = 0;
  std::vector<TokenLogprobEntry> top_logprobs;

  bool operator==(const PromptLogprob&) const = default;
};

// One event of a request's stream: a token (and the text it completed), or the end.
struct TokenEvent {
  RequestId request_id = 0;
  TokenId token = kNoToken;  // kNoToken on an end event that carries no token
  std::string text;          // new text, whole UTF-8 characters (may be empty)
  float logprob = 0.0f;
  std::vector<TokenLogprobEntry> top_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::none;
  std::string error;  // when finish_reason is error
  // Whose fault the error is: invalid_argument, the request's (a constraint that cannot be
  // followed: 400); internal or unavailable, the server's (a lost node: 500, 503).
  ErrorCode error_code = ErrorCode::internal;
  // On the request's first event, when it asked for prompt_logprobs: one entry for each
  // prompt position from 1 (position 0 has no context; vLLM's null).
  std::vector<PromptLogprob> prompt_logprobs;
  // Set on the end event.
  std::int32_t num_prompt_tokens = 0;
  std::int32_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache
  std::int32_t num_generated_tokens = 0;
};

using TokenCallback = std::function<void(const TokenEvent&)>;

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

  bool operator==(const ReplicaStats&) const = default;
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
};

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
  // The whole engine's numbers (summed over its replicas).
  EngineStats stats() const;
  // Each replica's, in order (one entry without data parallelism).
  std::vector<ReplicaStats> replicas() const;
  // A cluster's nodes (empty without a cluster).
  std::vector<NodeStatus> nodes() const;
  // Replicas with a worker now, and in all; cheap (no message), for /health.
  std::int32_t num_replicas_up() const;
  std::int32_t num_replicas() const;
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
  BatchingPolicy scheduling_policy() const;
  // The token budget as it starts: "2048 tokens per step", or the auto budget with
  // what it measured ("auto, 96 tokens per step beside a decode ...").
  const std::string& token_budget_description() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
