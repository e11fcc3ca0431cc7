// bench/goodput: the open-loop arrivals of bench serve (seeded), the objectives of --goodput
// and the arithmetic of the goodput, the percentile options.
#include "bench/goodput.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>

using namespace troupe::bench;

namespace {

struct Moments {
  double mean = 0.0, cv = 0.0;  // mean and coefficient of variation
};

Moments moments(const std::vector<double>& v) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double squares = 0.0;
  for (const double x : v) squares += (x - mean) * (x - mean);
  return {mean, std::sqrt(squares / static_cast<double>(v.size())) / mean};
}

}  // namespace

TEST_CASE("arrivals are one sequence per seed", "[bench][goodput]") {
  CHECK(arrival_gaps(5.0, 1.0, 7, 100) == arrival_gaps(5.0, 1.0, 7, 100));
  CHECK(arrival_gaps(5.0, 0.5, 7, 100) == arrival_gaps(5.0, 0.5, 7, 100));
  CHECK(arrival_gaps(5.0, 1.0, 7, 100) != arrival_gaps(5.0, 1.0, 8, 100));
  CHECK(arrival_gaps(5.0, 0.5, 7, 100) != arrival_gaps(5.0, 1.0, 7, 100));
  SECTION("a longer run begins as the shorter one") {
    const auto longer = arrival_gaps(3.0, 2.0, 1, 50);
    const auto shorter = arrival_gaps(3.0, 2.0, 1, 20);
    CHECK(std::vector<double>(longer.begin(), longer.begin() + 20) == shorter);
  }
}

TEST_CASE("at burstiness 1 the arrivals are the Poisson process earlier runs drew",
          "[bench][goodput]") {
  std::mt19937_64 rng(42);
  std::exponential_distribution<double> gap(4.0);
  std::vector<double> expected(200);
  for (double& g : expected) g = gap(rng);
  CHECK(arrival_gaps(4.0, 1.0, 42, 200) == expected);
}

TEST_CASE("the gaps have mean 1 / rate and the gamma's spread of the burstiness",
          "[bench][goodput]") {
  // A gamma of shape B has a coefficient of variation of 1 / sqrt(B): 1 for Poisson.
  for (const double burstiness : {0.25, 1.0, 4.0}) {
    for (const double rate : {0.5, 5.0}) {
      INFO("rate " << rate << ", burstiness " << burstiness);
      const auto gaps = arrival_gaps(rate, burstiness, 3, 40000);
      const Moments m = moments(gaps);
      CHECK(m.mean == Approx(1.0 / rate).epsilon(0.04));
      CHECK(m.cv == Approx(1.0 / std::sqrt(burstiness)).epsilon(0.05));
      CHECK(*std::min_element(gaps.begin(), gaps.end()) >= 0.0);
    }
  }
}

TEST_CASE("an infinite rate sends everything at once", "[bench][goodput]") {
  CHECK(arrival_gaps(0.0, 1.0, 1, 5) == std::vector<double>(5, 0.0));
  CHECK(arrival_gaps(INFINITY, 1.0, 1, 3) == std::vector<double>(3, 0.0));
  CHECK(arrival_gaps(2.0, 1.0, 1, 0).empty());
}

TEST_CASE("the goodput objectives are vLLM's NAME:MS pairs and nothing else", "[bench][goodput]") {
  const auto all = parse_goodput({"ttft:4000", "tpot:250", "e2el:20000.5"});
  REQUIRE(all);
  CHECK(*all->ttft_ms == 4000.0);
  CHECK(*all->tpot_ms == 250.0);
  CHECK(*all->e2el_ms == 20000.5);
  const auto one = parse_goodput({"tpot:0"});
  REQUIRE(one);
  CHECK_FALSE(one->ttft_ms);
  CHECK(*one->tpot_ms == 0.0);
  CHECK_FALSE(one->e2el_ms);
  CHECK(one->any());
  const auto none = parse_goodput({});
  REQUIRE(none);
  CHECK_FALSE(none->any());
  for (const char* bad :
       {"itl:10", "ttft", "ttft:", "ttft:-1", "ttft:abc", "ttft:5ms", "tpot:inf", ":5"}) {
    INFO(bad);
    const auto refused = parse_goodput({bad});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().message.find(bad) != std::string::npos);
  }
  CHECK_FALSE(parse_goodput({"ttft:1", "ttft:2"}));
}

TEST_CASE("a good request meets every objective given, at most each bound", "[bench][goodput]") {
  ServiceObjectives slo;
  slo.ttft_ms = 4000.0;
  slo.tpot_ms = 250.0;
  CHECK(meets({4000.0, 250.0, 1e9}, slo));  // the bounds themselves are met; e2el is free
  CHECK_FALSE(meets({4000.1, 10.0, 0.0}, slo));
  CHECK_FALSE(meets({10.0, 250.1, 0.0}, slo));
  CHECK(meets({10.0, 0.0, 0.0}, slo));  // one output token: a TPOT of 0, as vLLM
  slo.e2el_ms = 5000.0;
  CHECK_FALSE(meets({10.0, 10.0, 5000.5}, slo));
  CHECK(meets({1e9, 1e9, 1e9}, ServiceObjectives{}));  // no objective: every request
}

TEST_CASE("the goodput counts the requests that meet every objective", "[bench][goodput]") {
  // Issue 35's objectives (TTFT <= 4 s, TPOT <= 0.25 s) over six requests: the second
  // misses its TTFT, the fourth its TPOT, the sixth both.
  const std::vector<RequestLatency> requests{{340.0, 120.0, 9000.0},  {4100.0, 90.0, 12000.0},
                                             {3999.0, 249.0, 8000.0}, {200.0, 260.0, 30000.0},
                                             {1.0, 0.0, 1.0},         {7100.0, 300.0, 40000.0}};
  ServiceObjectives slo;
  slo.ttft_ms = 4000.0;
  slo.tpot_ms = 250.0;
  CHECK(count_good(requests, slo) == 3);
  slo.e2el_ms = 8500.0;
  CHECK(count_good(requests, slo) == 2);  // and the first is too long end to end
  CHECK(count_good(requests, ServiceObjectives{}) == 6);
  CHECK(count_good({}, slo) == 0);
}

TEST_CASE("the percentile options take vLLM's metric names and percentiles", "[bench][goodput]") {
  const auto metrics = parse_percentile_metrics("e2el,ttft, itl");
  REQUIRE(metrics);
  CHECK(*metrics == std::vector<std::string>{"ttft", "itl", "e2el"});  // vLLM's order
  CHECK_FALSE(parse_percentile_metrics("ttft,latency"));
  CHECK_FALSE(parse_percentile_metrics(""));
  const auto percentiles = parse_metric_percentiles("50,90,99.9,100");
  REQUIRE(percentiles);
  CHECK(*percentiles == std::vector<double>{50.0, 90.0, 99.9, 100.0});
  for (const char* bad : {"0", "101", "-5", "fifty", "50,", ""}) {
    INFO(bad);
    CHECK_FALSE(parse_metric_percentiles(bad));
  }
  CHECK(percentile_word(99.0) == "99");
  CHECK(percentile_word(99.9) == "99.9");
  CHECK(percentile_word(50.0) == "50");
}
