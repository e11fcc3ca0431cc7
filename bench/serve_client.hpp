// `troupe bench serve` (like `vllm bench serve`): a client of any
// OpenAI-compatible server. It streams /v1/completions requests with a random
// dataset of seeded lengths, at a Poisson request rate (or all at once) and
// under a concurrency limit, and measures TTFT, TPOT, ITL and end-to-end latency.
#pragma once

#include <cstdint>
#include <string>

#include "bench/latency.hpp"
#include "troupe/result.hpp"
#include "troupe/types.hpp"

namespace troupe::bench {

struct ServeOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8000;
  std::string model = "troupe";
  std::string api_key;
  std::int32_t num_prompts = 100;
  std::int32_t input_len = 128;
  std::int32_t output_len = 128;
  double range_ratio = 0.0;
  double request_rate = 0.0;         // requests/s, Poisson arrivals; 0: all at once (inf)
  std::int32_t max_concurrency = 0;  // 0: unlimited
  std::uint64_t seed = 0;
  std::int32_t vocab_size = 32000;  // prompt token ids are drawn from [1000, vocab_size)
};

struct ServeResult {
  std::int32_t completed = 0;
  std::int32_t failed = 0;
  double duration_s = 0.0;
  std::int64_t total_input_tokens = 0;
  std::int64_t total_output_tokens = 0;
  double request_throughput = 0.0;
  double output_throughput = 0.0;
  Latencies latency;
  std::string first_error;
};

Result<ServeResult> run_serve_benchmark(const ServeOptions& options);
std::string to_json(const ServeOptions& options, const ServeResult& result);
void print(const ServeOptions& options, const ServeResult& result);

}  // namespace troupe::bench
