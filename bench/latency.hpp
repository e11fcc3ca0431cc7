// What the benchmarks' results share: request totals and per-request TTFT, TPOT, ITL and
// end-to-end samples pooled over a run, summarised as mean, median and p99
// under vLLM's names (mean_ttft_ms, median_ttft_ms, p99_ttft_ms, ...).
#pragma once

#include <boost/json/object.hpp>
#include <chrono>
#include <cstdint>
#include <string_view>
#include <vector>

namespace troupe::bench {

struct Percentiles {
  double mean = 0.0, median = 0.0, p99 = 0.0;
};

// Mean, median and 99th percentile of a sample (zeros when empty).
Percentiles percentiles(std::vector<double> values);

// The nearest-rank `p` quantile (0 < p <= 1) of a sorted, non-empty sample.
double nearest_rank(const std::vector<double>& sorted, double p);

struct Latencies {
  Percentiles ttft_ms, tpot_ms, itl_ms, e2el_ms;
};

class LatencySamples {
 public:
  using Clock = std::chrono::steady_clock;
  // One request: submitted at `start`, first and last token, token count, gaps between tokens.
  void add(Clock::time_point start, Clock::time_point first, Clock::time_point last,
           std::int64_t num_tokens, const std::vector<double>& gaps_ms);
  Latencies summarize() const;
  // One metric's samples in the order added: "ttft", "tpot", "itl" or "e2el" (empty for
  // another name).
  const std::vector<double>& values(std::string_view metric) const;

 private:
  std::vector<double> ttft_, tpot_, itl_, e2el_;
};

// What every benchmark counts of its requests, under vLLM's names.
struct RequestTotals {
  std::int32_t completed = 0;
  std::int32_t failed = 0;
  double duration_s = 0.0;
  std::int64_t total_input_tokens = 0;
  std::int64_t total_output_tokens = 0;
  double request_throughput = 0.0;  // completed requests/s
  double output_throughput = 0.0;   // output tokens/s

  // Sets the run's duration and the rates over it.
  void set_duration(double seconds);
};

// The four lines of "mean / median / p99" a bench prints.
void print_latencies(const Latencies& latencies);
// Appends completed, failed, duration, total_input_tokens, ..., output_throughput to a result.
void add_totals(boost::json::object& json, const RequestTotals& totals);
// Appends the twelve fields mean_ttft_ms, median_ttft_ms, p99_ttft_ms, ... to a result.
void add_latencies(boost::json::object& json, const Latencies& latencies);

}  // namespace troupe::bench
