// The server's Prometheus metrics (prometheus-cpp's registry and text format;
// net/ serves them at GET /metrics). Actors and the HTTP front record into it;
// it knows nothing of either. Every method is thread-safe. Every troupe_ metric carries
// a model_name label, as vLLM's do; the process_* metrics of the Prometheus client
// libraries come with them. docs/metrics.md lists them all, and vLLM's names beside.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::monitoring {

class Metrics {
 public:
  // `model_name`: the served model's name (--served-model-name), the model_name label's
  // value on every troupe_ metric. Every series whose labels are known before its first
  // event starts at 0, as vLLM's do (a dashboard or an alert reads 0, not "no data"):
  // each finish reason, each connection-error reason, and the per-replica series of
  // replicas 0 .. num_replicas - 1 (down until their scheduler says up).
  explicit Metrics(std::string model_name = "troupe", std::int32_t num_replicas = 1);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The Prometheus text exposition of every metric.
  std::string serialize() const;

  // --- one model iteration (a replica's scheduler actor) ---
  struct Iteration {
    std::int32_t replica = 0;        // which data-parallel replica ran it
    std::int32_t num_kv_blocks = 0;  // the replica's, to weigh its KV usage
    double seconds = 0.0;            // in the worker
    // From sending the step to hearing its output: the worker's time plus the way
    // there and back (an actor hop in process, the network to a node).
    double round_trip_seconds = 0.0;
    std::int64_t num_tokens = 0;
    std::int64_t num_prompt_tokens = 0;
    std::int64_t num_generated = 0;
    std::int64_t num_running = 0;
    std::int64_t num_waiting = 0;
    double kv_usage = 0.0;
    // The replica's totals since it started: the counters move by what is new since the
    // last iteration it recorded.
    std::int64_t preemptions_total = 0;
    std::int64_t prefix_queried_total = 0;
    std::int64_t prefix_hits_total = 0;
    // Speculative decoding's totals (vLLM's spec_decode counters): drafts verified, their
    // tokens, accepted tokens, and accepted tokens by position in the draft.
    std::int64_t spec_drafts_total = 0;
    std::int64_t spec_draft_tokens_total = 0;
    std::int64_t spec_accepted_tokens_total = 0;
    std::vector<std::int64_t> spec_accepted_per_pos_total = {};
    // Running and waiting requests by LoRA adapter slot ([slot], 0 the base model; a
    // slot past the end has none): troupe_lora_requests_running/_waiting.
    std::vector<std::int64_t> running_by_adapter = {};
    std::vector<std::int64_t> waiting_by_adapter = {};
  };
  void record_iteration(const Iteration& iteration);
  // A pipelined replica's step: each hop of its hidden states into a later stage, in
  // seconds (troupe_pipeline_hop_seconds; LlamaModel::take_hop_seconds says what is timed).
  void record_pipeline_hops(const std::vector<double>& seconds);
  // The LoRA adapters served (--lora-modules): names[i] is adapter slot i + 1. Their
  // troupe_lora_requests_running and _waiting series (label lora_name) start at 0; each
  // iteration sets them to the sum over replicas. Call before the engine runs.
  void set_lora_adapters(const std::vector<std::string>& names);
  // A run-time load names slot `slot` (its series start at 0); an empty name (an unload)
  // takes the slot's series away.
  void name_lora_adapter(std::int32_t slot, const std::string& name);
  void observe_queue_time(double seconds);

  // A replica's load now (record_iteration sets it too): after it lost its worker, say.
  void set_replica_load(std::int32_t replica, std::int64_t num_running, std::int64_t num_waiting,
                        double kv_usage, std::int32_t num_kv_blocks);

  // --- the cluster (the head) ---
  // A replica has a worker (up) or lost it and waits for a node (down).
  void set_replica_up(std::int32_t replica, bool up);
  // An elastic replica left with its node: its series read 0 (down, no load), and one that
  // takes its index later counts from 0.
  void replica_left(std::int32_t replica);
  // How many replicas there are now, and the range they move in (elastic; a fixed count
  // is all three); `max` < 0: no cap (+Inf). The changes of `current` count as replicas
  // added and removed.
  void set_replica_count(std::int32_t current, std::int32_t min, std::int32_t max);
  // A replica lost its worker; `num_resubmitted` of its requests went to other replicas.
  void record_replica_loss(std::int32_t replica, std::int64_t num_resubmitted);
  // Requests that had streamed tokens and resume elsewhere after their worker was lost.
  void record_migrations(std::int64_t num_requests);
  // The nodes joined now, and one more join.
  void record_node_join(std::int64_t num_nodes);
  void set_num_nodes(std::int64_t num_nodes);

  // --- one request (its actor, when it ends) ---
  void observe_request(std::string_view finish_reason, double e2e_seconds, double ttft_seconds,
                       double tpot_seconds, bool has_tokens);
  // Its prompt and generated tokens (vLLM's request_prompt_tokens and
  // request_generation_tokens); a negative count is not observed.
  void observe_request_tokens(std::int32_t num_prompt_tokens, std::int32_t num_generated_tokens);
  void observe_inter_token(double seconds);
  // From the first scheduled step to the first token, and from there to the last.
  void observe_phases(double prefill_seconds, double decode_seconds);

  // --- the HTTP front ---
  void count_http(std::string_view route, int status);
  // Set when /metrics is scraped: open connections, generation requests admitted and
  // not yet ended in the engine, and actors alive in the engine's actor system.
  void set_server_state(std::int64_t num_connections, std::int64_t num_requests_in_flight,
                        std::int64_t num_live_actors);
  // The server drains (troupe_server_draining): set once, when the drain begins.
  void set_draining(bool draining);
  // A connection the server ended on its own: "exception" (a defect caught at the
  // connection's top frame), "slow_reader" (output past its bound), "bad_request"
  // (kConnectionErrorReasons).
  void count_connection_error(std::string_view reason);
  static constexpr std::string_view kConnectionErrorReasons[] = {"exception", "slow_reader",
                                                                 "bad_request", "tls_handshake"};
  // accept() failed (descriptor limit, aborted handshake); the server retries.
  void count_accept_error();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::monitoring
