// `troupe bench serve` (like `vllm bench serve`): a client of any
// OpenAI-compatible server. It streams /v1/completions requests with the random
// dataset of bench/workload, at a Poisson request rate (or all at once) and
// under a concurrency limit, and measures TTFT, TPOT, ITL and end-to-end latency.
#pragma once

#include <cstdint>
#include <string>

#include "bench/latency.hpp"
#include "bench/workload.hpp"
#include "troupe/result.hpp"

namespace troupe::bench {

struct ServeOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8000;
  std::string model = "troupe";
  std::string api_key;
  // The random dataset; prompt ids from [kFirstPromptToken, vocab_size) of the server's model.
  WorkloadOptions workload{.num_prompts = 100, .input_len = 128, .output_len = 128};
  double request_rate = 0.0;         // requests/s, Poisson arrivals; 0: all at once (inf)
  std::int32_t max_concurrency = 0;  // 0: unlimited
};

struct ServeResult {
  RequestTotals totals;
  Latencies latency;
  std::string first_error;
};

Result<ServeResult> run_serve_benchmark(const ServeOptions& options);
// The result as one JSON object under vLLM's keys, with a final newline.
std::string to_json(const ServeOptions& options, const ServeResult& result);
void print(const ServeOptions& options, const ServeResult& result);

}  // namespace troupe::bench
