// Latency statistics shared by the benchmarks: per-request TTFT, TPOT, ITL and
// end-to-end samples pooled over a run, summarised as mean, median and p99
// under vLLM's names (mean_ttft_ms, median_ttft_ms, p99_ttft_ms, ...).
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <vector>

namespace troupe::bench {

struct Percentiles {
  double mean = 0.0, median = 0.0, p99 = 0.0;
};

// Mean, median and 99th percentile of a sample (zeros when empty).
Percentiles percentiles(std::vector<double> values);

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

 private:
  std::vector<double> ttft_, tpot_, itl_, e2el_;
};

// The four lines of "mean / median / p99" a bench prints.
void print_latencies(const Latencies& latencies);
// ",\n  \"mean_ttft_ms\": ..." for each of the twelve fields, to follow other JSON fields.
void write_latencies_json(std::ostream& out, const Latencies& latencies);

}  // namespace troupe::bench
