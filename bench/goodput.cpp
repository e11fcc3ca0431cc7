#include "bench/goodput.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>

namespace troupe::bench {

namespace {

constexpr std::string_view kMetricOrder[] = {"ttft", "tpot", "itl", "e2el"};

std::vector<std::string_view> split(std::string_view list, char separator) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t end = list.find(separator, start);
    parts.push_back(list.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// A finite number and nothing else.
std::optional<double> number(std::string_view text) {
  text = trim(text);
  double value = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

std::vector<double> arrival_gaps(double rate, double burstiness, std::uint64_t seed,
                                 std::size_t count) {
  std::vector<double> gaps(count, 0.0);
  if (!(rate > 0) || !std::isfinite(rate) || !(burstiness > 0)) return gaps;
  std::mt19937_64 rng(seed);
  if (burstiness == 1.0) {
    // The exponential law itself: the sequence earlier runs of this client drew.
    std::exponential_distribution<double> gap(rate);
    for (double& g : gaps) g = gap(rng);
  } else {
    std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
    for (double& g : gaps) g = gap(rng);
  }
  return gaps;
}

Result<ServiceObjectives> parse_goodput(const std::vector<std::string>& pairs) {
  ServiceObjectives objectives;
  for (const std::string& pair : pairs) {
    const auto colon = pair.find(':');
    const std::string_view name = trim(std::string_view(pair).substr(0, colon));
    std::optional<double>* slot = name == "ttft"   ? &objectives.ttft_ms
                                  : name == "tpot" ? &objectives.tpot_ms
                                  : name == "e2el" ? &objectives.e2el_ms
                                                   : nullptr;
    if (colon == std::string::npos || slot == nullptr) {
      return make_error(ErrorCode::invalid_argument,
                        "--goodput takes NAME:MILLISECONDS with NAME one of ttft, tpot, e2el, "
                        "not '" +
                            pair + "'");
    }
    const auto value = number(std::string_view(pair).substr(colon + 1));
    if (!value || *value < 0) {
      return make_error(ErrorCode::invalid_argument,
                        "--goodput '" + pair +
                            "': the objective must be a non-negative number "
                            "of milliseconds");
    }
    if (*slot) {
      return make_error(ErrorCode::invalid_argument,
                        "--goodput names " + std::string(name) + " twice");
    }
    *slot = *value;
  }
  return objectives;
}

bool meets(const RequestLatency& r, const ServiceObjectives& o) {
  return (!o.ttft_ms || r.ttft_ms <= *o.ttft_ms) && (!o.tpot_ms || r.tpot_ms <= *o.tpot_ms) &&
         (!o.e2el_ms || r.e2el_ms <= *o.e2el_ms);
}

std::int32_t count_good(const std::vector<RequestLatency>& requests,
                        const ServiceObjectives& objectives) {
  return static_cast<std::int32_t>(
      std::count_if(requests.begin(), requests.end(),
                    [&](const RequestLatency& r) { return meets(r, objectives); }));
}

Result<std::vector<std::string>> parse_percentile_metrics(std::string_view list) {
  std::vector<std::string_view> asked;
  for (const std::string_view part : split(list, ',')) {
    const std::string_view name = trim(part);
    if (std::find(std::begin(kMetricOrder), std::end(kMetricOrder), name) ==
        std::end(kMetricOrder)) {
      return make_error(ErrorCode::invalid_argument, "--percentile-metrics: '" + std::string(name) +
                                                         "' is none of ttft, tpot, itl, e2el");
    }
    asked.push_back(name);
  }
  std::vector<std::string> metrics;
  for (const std::string_view name : kMetricOrder) {
    if (std::find(asked.begin(), asked.end(), name) != asked.end()) metrics.emplace_back(name);
  }
  return metrics;
}

Result<std::vector<double>> parse_metric_percentiles(std::string_view list) {
  std::vector<double> percentiles;
  for (const std::string_view part : split(list, ',')) {
    const auto p = number(part);
    if (!p || !(*p > 0) || *p > 100) {
      return make_error(ErrorCode::invalid_argument, "--metric-percentiles: '" +
                                                         std::string(trim(part)) +
                                                         "' is not a percentile in (0, 100]");
    }
    percentiles.push_back(*p);
  }
  return percentiles;
}

std::string percentile_word(double p) {
  if (p == std::floor(p)) return std::to_string(static_cast<long long>(p));
  char text[32];
  std::snprintf(text, sizeof text, "%.15g", p);
  return text;
}

}  // namespace troupe::bench
