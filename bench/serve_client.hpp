// `troupe bench serve` (like `vllm bench serve`): a client of any OpenAI-compatible server. It
// asks GET /v1/models for the model's name, vocabulary size and context length, then streams
// /v1/completions requests with the random dataset of bench/workload, at a request rate with
// Poisson or gamma arrivals (or all at once) and under a concurrency limit, and measures TTFT,
// TPOT, ITL and end-to-end latency, their percentiles, and the goodput of the objectives given.
// Prompts are token ids, not text: each has exactly the length asked for, where text would
// re-tokenize to another length.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/goodput.hpp"
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
  double request_rate = 0.0;  // requests/s; 0: all at once (inf)
  // The arrivals' gamma shape (vLLM's --burstiness): 1 a Poisson process, below 1 burstier.
  double burstiness = 1.0;
  std::int32_t max_concurrency = 0;  // 0: unlimited
  ServiceObjectives goodput;         // --goodput; none: no goodput reported
  // --percentile-metrics (in vLLM's order) and --metric-percentiles: what the summary
  // prints, and the p<P>_<metric>_ms keys of the JSON.
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};
  std::vector<double> metric_percentiles = {99.0};
  bool progress = true;  // on stderr: a bar on a terminal, else a line per 10%
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

// What one server-sent event of a streamed /v1/completions answer says (`data` is the text
// after "data: "): whether it brings a token's text, and the usage's completion_tokens where
// it has one. OpenAI's and vLLM's servers (and troupe) send the usage in a chunk of its own with
// no choices; llama.cpp's server puts it on its final choice, whose text is empty and whose
// finish_reason is set: that event closes the stream and brings no token.
struct StreamEvent {
  bool token = false;
  std::int32_t completion_tokens = -1;  // -1: no usage in this event
};
StreamEvent read_stream_event(std::string_view data);

// One metric's asked percentiles (nearest rank, as the p99 of every troupe bench).
struct MetricPercentiles {
  std::string metric;                             // "ttft", "tpot", "itl", "e2el"
  std::vector<std::pair<double, double>> values;  // (percentile, milliseconds)
};

struct ServeResult {
  ServedModel server;  // as used: the model sent, the ids' bound, the context length
  RequestTotals totals;
  double total_token_throughput = 0.0;  // (input + output tokens)/s
  Latencies latency;
  std::vector<MetricPercentiles> percentiles;  // the options' metrics, in their order
  std::int32_t num_good = 0;                   // completed requests that met every objective
  double request_goodput = 0.0;                // num_good / duration (with objectives)
  std::string first_error;
};

// The options' percentiles of each of their metrics.
std::vector<MetricPercentiles> select_percentiles(const ServeOptions& options,
                                                  const LatencySamples& samples);

Result<ServeResult> run_serve_benchmark(const ServeOptions& options);
// The result as one JSON object under vLLM's keys, with a final newline.
std::string to_json(const ServeOptions& options, const ServeResult& result);
// vLLM's "Serving Benchmark Result" block, line for line.
std::string summary(const ServeOptions& options, const ServeResult& result);

}  // namespace troupe::bench
