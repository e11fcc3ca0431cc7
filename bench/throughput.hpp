// Offline throughput benchmark (like `vllm bench throughput`): every request
// submitted at once through the Engine API, in-process, ignoring EOS so that
// output lengths are as drawn; latency percentiles under vLLM's names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/latency.hpp"
#include "troupe/engine.hpp"

namespace troupe::bench {

struct ThroughputOptions {
  EngineConfig engine;
  std::string dataset = "random";  // random | anyscale | shared-prefix
  std::int32_t num_prompts = 256;
  std::int32_t input_len = 512;
  std::int32_t output_len = 128;
  std::int32_t prefix_len = 512;
  double range_ratio = 0.0;
  std::uint64_t seed = 0;
  float temperature = 1.0f;
};

struct BenchRequest {
  std::vector<TokenId> prompt;
  std::int32_t output_len = 0;
};

// Draws the dataset: token ids from the vocabulary's normal tokens.
std::vector<BenchRequest> make_dataset(const ThroughputOptions& options,
                                       const model::Tokenizer& tokenizer);

struct ThroughputResult {
  std::int32_t completed = 0;
  std::int32_t failed = 0;
  double duration_s = 0.0;
  std::int64_t total_input_tokens = 0;
  std::int64_t total_output_tokens = 0;
  double request_throughput = 0.0;      // requests/s
  double output_throughput = 0.0;       // output tokens/s
  double total_token_throughput = 0.0;  // (input + output) tokens/s
  Latencies latency;
  double mean_batch_size = 0.0;  // sequences per iteration
  double peak_kv_usage = 0.0;
  std::int64_t num_preemptions = 0;
  double prefix_cache_hit_rate = 0.0;
  std::int64_t num_steps = 0;
  double mean_step_ms = 0.0;      // worker: forward and sampling
  double mean_schedule_ms = 0.0;  // scheduler's own logic per iteration
};

Result<ThroughputResult> run_throughput(const ThroughputOptions& options);

std::string to_json(const ThroughputOptions& options, const ThroughputResult& result);
void print(const ThroughputOptions& options, const ThroughputResult& result);

}  // namespace troupe::bench
