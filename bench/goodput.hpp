// What `troupe bench serve` judges a server by beyond throughput, as vLLM's `bench serve`:
// open-loop arrivals (a Poisson process, or a gamma one of another burstiness), service level
// objectives per request and the goodput they give (DistServe: the completed requests per
// second that met every objective), and the percentiles a run reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/result.hpp"

namespace troupe::bench {

// The gaps, in seconds, after each of `count` requests: gamma-distributed with mean
// 1 / rate and shape `burstiness` (vLLM's: 1 is a Poisson process, below 1 burstier,
// above 1 more even); all 0 when rate is 0 (inf: every request at once). One seed, one
// sequence.
std::vector<double> arrival_gaps(double rate, double burstiness, std::uint64_t seed,
                                 std::size_t count);

// vLLM's --goodput: each objective a bound in milliseconds that a request must not exceed.
struct ServiceObjectives {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;

  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

// "ttft:4000", "tpot:250", "e2el:20000" (vLLM's syntax), each name once; an error naming
// what is wrong otherwise.
Result<ServiceObjectives> parse_goodput(const std::vector<std::string>& pairs);

// One completed request's latencies. tpot_ms is 0 for a request of one output token (vLLM's).
struct RequestLatency {
  double ttft_ms = 0.0, tpot_ms = 0.0, e2el_ms = 0.0;
};

// Whether a request met every objective given (at most the bound: vLLM's comparison).
bool meets(const RequestLatency& request, const ServiceObjectives& objectives);
// Completed requests that met every objective.
std::int32_t count_good(const std::vector<RequestLatency>& requests,
                        const ServiceObjectives& objectives);

// vLLM's --percentile-metrics (ttft, tpot, itl, e2el; comma-separated, in any order):
// the metrics in vLLM's order of print; an error naming an unknown one.
Result<std::vector<std::string>> parse_percentile_metrics(std::string_view list);
// vLLM's --metric-percentiles ("25,50,99.9"): each within (0, 100].
Result<std::vector<double>> parse_metric_percentiles(std::string_view list);
// How vLLM writes a percentile in a label or a key: "99", "99.9".
std::string percentile_word(double p);

}  // namespace troupe::bench
