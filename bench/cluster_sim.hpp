// The cluster simulator behind `troupe bench cluster-sim`: the real engine::Router in front
// of N real engine::Schedulers, on simulated time, so that routing policies can be compared
// at a size no machine here can host. Each replica's iteration lasts what a step-time model
// says; the "model" samples deterministic fake tokens, never an end-of-generation one, so
// every request ends on its max_tokens. No threads, no I/O: a run is a pure function of
// its options.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/router.hpp"
#include "engine/scheduler.hpp"
#include "troupe/result.hpp"

namespace troupe::bench {

// How long one iteration of a replica takes: a + b * num_tokens + c * num_sequences seconds.
// The default is the ~110M F16 model on the 2-core VM: a weighted (relative-error) least
// squares fit to `troupe bench forward --prompt-len 128|512 --batch 1,8,32,64` (prefill of one
// sequence in one step, batched decode), within 9% of all ten points (BENCHMARKS.md, "The
// cluster simulator"). It ignores the context length: long chats decode somewhat slower.
struct StepTimeModel {
  double a = 5.91e-3;   // seconds per step, whatever it holds
  double b = 0.769e-3;  // seconds per token
  double c = 0.197e-3;  // seconds per sequence (attention, logits, sampling)
  std::string name = "~110M F16 on the 2-core VM, fit to bench forward";

  double seconds(std::int32_t num_tokens, std::int32_t num_sequences) const {
    return a + b * num_tokens + c * num_sequences;
  }
};

// A step-time model from text: "a b c" (seconds; then optionally a name) or a JSON object
// {"a": ..., "b": ..., "c": ..., "name": "..."}. Errors say what is missing or negative.
Result<StepTimeModel> parse_step_time_model(std::string_view text);

enum class SimWorkload {
  // Chat sessions: each turn's prompt is the previous prompt, its answer and a new user
  // message; the next turn arrives when the answer has ended plus a think time.
  multi_turn,
  // A few long shared prefixes (system prompts), each request one of them plus its own suffix.
  shared_prefix,
};

std::optional<SimWorkload> parse_sim_workload(std::string_view name);
std::string_view to_string(SimWorkload workload);

// Lengths are drawn uniformly in [min, max] tokens.
struct MultiTurnShape {
  std::int32_t system_prompt_len = 256;  // shared by every session; 0: none
  std::int32_t min_turns = 4, max_turns = 8;
  std::int32_t min_user_len = 16, max_user_len = 128;
  std::int32_t min_answer_len = 32, max_answer_len = 192;
  double mean_think_s = 10.0;  // exponential
};

struct SharedPrefixShape {
  std::int32_t num_prefixes = 4;
  std::int32_t prefix_len = 1024;
  std::int32_t min_suffix_len = 32, max_suffix_len = 256;
  std::int32_t min_output_len = 32, max_output_len = 192;
};

struct ClusterSimOptions {
  SimWorkload workload = SimWorkload::multi_turn;
  std::int32_t num_replicas = 64;
  std::int32_t num_requests = 20000;
  // Requests per second on average. Multi-turn sessions start as a Poisson process at
  // rate / (mean turns per session); shared-prefix requests arrive at this rate.
  double rate = 40.0;
  std::uint64_t seed = 0;
  // One replica's scheduler. num_blocks: 1 GiB of KV for the ~110M model in 16-token blocks.
  engine::SchedulerConfig replica = {.max_num_batched_tokens = 2048,
                                     .max_num_seqs = 256,
                                     .max_model_len = 4096,
                                     .num_blocks = 2730,
                                     .block_size = 16};
  engine::RouterConfig router;  // its policy is each run's
  StepTimeModel step_model;
  MultiTurnShape multi_turn;
  SharedPrefixShape shared_prefix;
};

// Latencies in seconds of simulated time.
struct LatencyQuantiles {
  double p50 = 0.0, p90 = 0.0, p99 = 0.0;
};

struct SimRunResult {
  std::string name;  // the router policy, or "single replica"
  std::int32_t num_replicas = 0;
  std::int32_t num_finished = 0;
  std::int64_t num_queried_tokens = 0;  // prompt tokens looked up in a prefix cache
  std::int64_t num_hit_tokens = 0;      // of those, found there
  LatencyQuantiles ttft_s, e2e_s;
  // max / mean of the running sequences per replica, averaged over the time any runs.
  double load_imbalance = 0.0;
  double mean_busy = 0.0;   // fraction of the run a replica spends in steps, over replicas
  double duration_s = 0.0;  // first arrival to last finish
  std::int64_t num_steps = 0;
  std::int64_t num_preemptions = 0;
  std::int32_t num_prefix_routes = 0;  // requests the router sent for their cached prefix
  std::vector<std::int32_t> requests_per_replica;
  double final_kv_usage = 0.0;  // the highest over replicas once all is done: 0 when freed

  double hit_rate() const {
    return num_queried_tokens == 0 ? 0.0 : static_cast<double>(num_hit_tokens) / num_queried_tokens;
  }
};

// One run: options.num_replicas replicas behind a router of `policy`. Errors: options that
// make no workload, a request no replica can hold, or a scheduler whose invariants are
// broken at the end (the message names the replica).
Result<SimRunResult> simulate_cluster(const ClusterSimOptions& options, RoutingPolicy policy);

// The reference for the hit rate: the same workload on ONE replica holding the whole
// cluster's KV blocks, sequence slots, token budget and compute (its per-token and
// per-sequence costs divided by N), so that requests arrive and finish much as they do on
// the cluster and only the split of the cache differs.
Result<SimRunResult> simulate_single_replica(const ClusterSimOptions& options);

}  // namespace troupe::bench
