// Offline throughput benchmark (like `vllm bench throughput`): every request
// submitted at once through the Engine API, in-process, ignoring EOS so that
// output lengths are as drawn (bench/workload); latency percentiles under vLLM's names.
// Under a grammar (structured outputs) the grammar's end still ends an output, so
// outputs may be shorter than drawn: the mean output length says by how much.
#pragma once

#include <cstdint>
#include <string>

#include "bench/latency.hpp"
#include "bench/workload.hpp"
#include "troupe/engine.hpp"

namespace troupe::bench {

struct ThroughputOptions {
  EngineConfig engine;
  std::string dataset = "random";  // random | anyscale | shared-prefix
  // Its dataset is `dataset`'s and its vocab_size the model's; its seed seeds sampling too.
  WorkloadOptions workload;
  float temperature = 1.0f;
  // GBNF every output is held to (SamplingParams::grammar); empty: free. `constraint`
  // names where it came from in the results ("json-schema FILE", "grammar FILE").
  std::string grammar;
  std::string constraint = "none";
  // With engine.lora_adapters, request i runs under adapter 1 + i % their number (all of
  // them adapted, spread evenly, so that a step mixes adapters as a multi-tenant load does).
};

struct ThroughputResult {
  RequestTotals totals;
  double mean_output_len = 0.0;         // output tokens per completed request
  std::int32_t num_grammar_ends = 0;    // outputs the grammar's end finished before max_tokens
  double total_token_throughput = 0.0;  // (input + output) tokens/s
  Latencies latency;
  double mean_batch_size = 0.0;  // sequences per iteration
  double peak_kv_usage = 0.0;
  std::int64_t num_preemptions = 0;
  double prefix_cache_hit_rate = 0.0;
  std::int64_t num_steps = 0;
  double mean_step_ms = 0.0;      // worker: forward and sampling
  double mean_schedule_ms = 0.0;  // scheduler's own logic per iteration
  // Iterations that carried decodes only: the running batch's own step, for comparing
  // the TPOT against (what a prefill chunk adds to a stream's wait).
  std::int64_t num_decode_steps = 0;
  double mean_decode_step_ms = 0.0;
  std::string token_budget;  // as the engine chose it at start
  // Speculative decoding (--speculative-config): drafts verified, their tokens, accepted.
  std::int64_t spec_num_drafts = 0;
  std::int64_t spec_num_draft_tokens = 0;
  std::int64_t spec_num_accepted_tokens = 0;
  // Reading and checking each LoRA adapter against the model (LoraAdapter::open: the file,
  // its checks, its conversion to F32), the mean over engine.lora_adapters, timed apart
  // from the engine's start. 0 without adapters.
  double mean_lora_load_ms = 0.0;
};

Result<ThroughputResult> run_throughput(const ThroughputOptions& options);

// The result as one JSON object (vLLM's keys and troupe's own), with a final newline.
std::string to_json(const ThroughputOptions& options, const ThroughputResult& result);
void print(const ThroughputOptions& options, const ThroughputResult& result);

}  // namespace troupe::bench
