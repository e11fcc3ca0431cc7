#include "bench/latency.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

namespace troupe::bench {

namespace {
using Named = std::pair<const char*, const Percentiles*>;
}

double nearest_rank(const std::vector<double>& sorted, double p) {
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0.0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  p.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2.0;
  p.p99 = nearest_rank(v, 0.99);
  return p;
}

void LatencySamples::add(Clock::time_point start, Clock::time_point first, Clock::time_point last,
                         std::int64_t num_tokens, const std::vector<double>& gaps_ms) {
  using ms = std::chrono::duration<double, std::milli>;
  ttft_.push_back(ms(first - start).count());
  e2el_.push_back(ms(last - start).count());
  if (num_tokens > 1)
    tpot_.push_back(ms(last - first).count() / static_cast<double>(num_tokens - 1));
  itl_.insert(itl_.end(), gaps_ms.begin(), gaps_ms.end());
}

Latencies LatencySamples::summarize() const {
  return Latencies{percentiles(ttft_), percentiles(tpot_), percentiles(itl_), percentiles(e2el_)};
}

const std::vector<double>& LatencySamples::values(std::string_view metric) const {
  static const std::vector<double> kNone;
  return metric == "ttft"   ? ttft_
         : metric == "tpot" ? tpot_
         : metric == "itl"  ? itl_
         : metric == "e2el" ? e2el_
                            : kNone;
}

void RequestTotals::set_duration(double seconds) {
  duration_s = seconds;
  request_throughput = completed / seconds;
  output_throughput = static_cast<double>(total_output_tokens) / seconds;
}

void print_latencies(const Latencies& l) {
  for (const auto& [name, p] : {Named{"TTFT", &l.ttft_ms}, Named{"TPOT", &l.tpot_ms},
                                Named{"ITL", &l.itl_ms}, Named{"E2E latency", &l.e2el_ms}}) {
    std::printf("%-12s mean %10.1f   median %10.1f   p99 %10.1f  (ms)\n", name, p->mean, p->median,
                p->p99);
  }
}

void add_totals(boost::json::object& json, const RequestTotals& t) {
  json["completed"] = t.completed;
  json["failed"] = t.failed;
  json["duration"] = t.duration_s;
  json["total_input_tokens"] = t.total_input_tokens;
  json["total_output_tokens"] = t.total_output_tokens;
  json["request_throughput"] = t.request_throughput;
  json["output_throughput"] = t.output_throughput;
}

void add_latencies(boost::json::object& json, const Latencies& l) {
  for (const auto& [name, p] : {Named{"ttft", &l.ttft_ms}, Named{"tpot", &l.tpot_ms},
                                Named{"itl", &l.itl_ms}, Named{"e2el", &l.e2el_ms}}) {
    const std::string suffix = std::string(name) + "_ms";
    json["mean_" + suffix] = p->mean;
    json["median_" + suffix] = p->median;
    json["p99_" + suffix] = p->p99;
  }
}

}  // namespace troupe::bench
