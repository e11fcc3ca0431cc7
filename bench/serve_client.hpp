// `troupe bench serve` (like `vllm bench serve`): a client of any OpenAI-compatible server. It
// asks GET /v1/models for the model's name, vocabulary size and context length, then streams
// /v1/completions requests with the random dataset of bench/workload, at a Poisson request rate
// (or all at once) and under a concurrency limit, and measures TTFT, TPOT, ITL and end-to-end
// latency. Prompts are token ids, not text: each has exactly the length asked for, where text
// would re-tokenize to another length.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/latency.hpp"
#include "bench/workload.hpp"
#include "troupe/result.hpp"

namespace troupe::bench {

struct ServeOptions {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8000;
  std::string model;  // empty: the server's (its first, when it serves several)
  std::string api_key;
  // The random dataset; prompt ids from [kFirstPromptToken, vocab_size). vocab_size 0: the
  // server's, from /v1/models, less the control tokens at its end.
  WorkloadOptions workload{
      .num_prompts = 100, .input_len = 128, .output_len = 128, .vocab_size = 0};
  double request_rate = 0.0;         // requests/s, Poisson arrivals; 0: all at once (inf)
  std::int32_t max_concurrency = 0;  // 0: unlimited
  bool progress = true;              // on stderr: a bar on a terminal, else a line per 10%
};

// One entry of GET /v1/models. vocab_size is troupe's own field (0 where a server has none,
// vLLM for one); max_model_len 0: not reported.
struct ServedModel {
  std::string id;
  std::int32_t vocab_size = 0;
  std::int32_t max_model_len = 0;
};

// The entry of a /v1/models answer named `wanted`, or its first when `wanted` is empty; an
// error naming the served models when none is `wanted`.
Result<ServedModel> parse_served_model(std::string_view models_json, std::string_view wanted);

// An error, before anything is sent, when a request's prompt and output exceed max_model_len
// (0: unknown, nothing to check).
Result<void> check_fits(const std::vector<BenchRequest>& requests, std::int32_t max_model_len);

struct ServeResult {
  ServedModel server;  // as used: the model sent, the ids' bound, the context length
  RequestTotals totals;
  double total_token_throughput = 0.0;  // (input + output tokens)/s
  Latencies latency;
  std::string first_error;
};

Result<ServeResult> run_serve_benchmark(const ServeOptions& options);
// The result as one JSON object under vLLM's keys, with a final newline.
std::string to_json(const ServeOptions& options, const ServeResult& result);
// vLLM's "Serving Benchmark Result" block, line for line.
std::string summary(const ServeOptions& options, const ServeResult& result);

}  // namespace troupe::bench
