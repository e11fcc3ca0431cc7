// bench/workload: the one generator behind troupe bench throughput, troupe bench serve and
// troupe-gpu-bench, so one seed must give one workload, drawn the same way everywhere.
#include "bench/workload.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>

using namespace troupe;
using bench::Dataset;
using bench::WorkloadOptions;

namespace {

std::vector<bench::BenchRequest> workload(const WorkloadOptions& o) {
  auto w = bench::make_workload(o);
  REQUIRE(w);
  return std::move(*w);
}

bool same(const std::vector<bench::BenchRequest>& a, const std::vector<bench::BenchRequest>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
    return x.prompt == y.prompt && x.output_len == y.output_len;
  });
}

double mean_output_len(const std::vector<bench::BenchRequest>& w) {
  const double sum = std::accumulate(w.begin(), w.end(), 0.0,
                                     [](double s, const auto& r) { return s + r.output_len; });
  return sum / static_cast<double>(w.size());
}

}  // namespace

TEST_CASE("one seed gives one workload, another seed another", "[bench]") {
  WorkloadOptions o{.num_prompts = 64,
                    .input_len = 32,
                    .output_len = 16,
                    .prefix_len = 8,
                    .range_ratio = 0.5,
                    .seed = 7};
  for (const Dataset dataset : {Dataset::random, Dataset::anyscale, Dataset::shared_prefix}) {
    INFO("dataset " << static_cast<int>(dataset));
    o.dataset = dataset;
    const auto first = workload(o);
    CHECK(first.size() == 64);
    CHECK(same(first, workload(o)));
    WorkloadOptions other = o;
    other.seed = 8;
    CHECK_FALSE(same(first, workload(other)));
  }
}

TEST_CASE("a seed pins its workload, whatever tool or build draws it", "[bench]") {
  // std::mt19937_64 mapped by hand, so no standard library's distributions can move these.
  const WorkloadOptions o{.dataset = Dataset::anyscale,
                          .num_prompts = 4,
                          .input_len = 3,
                          .output_len = 128,
                          .vocab_size = 32000,
                          .seed = 1};
  const auto w = workload(o);
  CHECK(w[0].prompt == std::vector<TokenId>{24145, 19071, 15989});
  CHECK(w[1].prompt == std::vector<TokenId>{1336, 29296, 18319});
  std::vector<std::int32_t> output_lens;
  for (const auto& r : w) output_lens.push_back(r.output_len);
  CHECK(output_lens == std::vector<std::int32_t>{3, 10, 104, 37});
}

TEST_CASE("prompt ids are drawn from the first normal piece to the vocabulary's end", "[bench]") {
  const WorkloadOptions o{.num_prompts = 32, .vocab_size = 600};
  const auto w = workload(o);
  TokenId lowest = o.vocab_size, highest = 0;
  for (const auto& r : w) {
    for (const TokenId t : r.prompt) {
      lowest = std::min(lowest, t);
      highest = std::max(highest, t);
    }
  }
  CHECK(lowest == bench::kFirstPromptToken);
  CHECK(highest == o.vocab_size - 1);
}

TEST_CASE("lengths keep the dataset's means and bounds", "[bench]") {
  WorkloadOptions o{.num_prompts = 4000, .input_len = 20, .output_len = 40, .seed = 3};
  SECTION("random: uniform within L * (1 - R) .. L * (1 + R)") {
    o.dataset = Dataset::random;
    o.range_ratio = 0.5;
    const auto w = workload(o);
    for (const auto& r : w) {
      REQUIRE(r.prompt.size() >= 10);
      REQUIRE(r.prompt.size() <= 30);
      REQUIRE(r.output_len >= 20);
      REQUIRE(r.output_len <= 60);
    }
    CHECK(mean_output_len(w) == Approx(40).epsilon(0.02));
  }
  SECTION("random without a range: exactly the lengths asked for") {
    o.dataset = Dataset::random;
    for (const auto& r : workload(o)) {
      REQUIRE(r.prompt.size() == 20);
      REQUIRE(r.output_len == 40);
    }
  }
  SECTION("anyscale: fixed prompts, outputs exponential with the mean, in 1 .. 4x") {
    o.dataset = Dataset::anyscale;
    o.range_ratio = 0.5;  // not used by this dataset
    const auto w = workload(o);
    for (const auto& r : w) {
      REQUIRE(r.prompt.size() == 20);
      REQUIRE(r.output_len >= 1);
      REQUIRE(r.output_len <= 160);
    }
    // The cap at 4x takes e^-4 of the mean away: 40 * (1 - e^-4) = 39.3.
    CHECK(mean_output_len(w) == Approx(39.3).epsilon(0.05));
    const auto at_cap =
        std::count_if(w.begin(), w.end(), [](const auto& r) { return r.output_len == 160; });
    CHECK(at_cap > 0);  // P(X > 4 * mean) = e^-4: about 73 of 4000
  }
  SECTION("shared-prefix: every prompt opens with the same system prompt") {
    o.dataset = Dataset::shared_prefix;
    o.prefix_len = 16;
    const auto w = workload(o);
    const std::vector<TokenId> prefix(w[0].prompt.begin(), w[0].prompt.begin() + 16);
    for (const auto& r : w) {
      REQUIRE(r.prompt.size() == 36);
      REQUIRE(std::equal(prefix.begin(), prefix.end(), r.prompt.begin()));
    }
    CHECK(w[0].prompt != w[1].prompt);  // the requests' own tokens differ
  }
}

TEST_CASE("only shared-prefix draws a system prompt", "[bench]") {
  WorkloadOptions o{.num_prompts = 8, .prefix_len = 16};
  const auto with_prefix_len_16 = workload(o);
  o.prefix_len = 512;
  CHECK(same(with_prefix_len_16, workload(o)));
}

TEST_CASE("a workload refuses lengths it cannot draw", "[bench]") {
  WorkloadOptions o;
  SECTION("a vocabulary that ends before the first prompt id") {
    o.vocab_size = bench::kFirstPromptToken;
    CHECK_FALSE(bench::make_workload(o));
  }
  SECTION("an empty prompt") {
    o.input_len = 0;
    CHECK_FALSE(bench::make_workload(o));
  }
  SECTION("a negative range") {
    o.range_ratio = -0.1;
    CHECK_FALSE(bench::make_workload(o));
  }
  SECTION("no prompts is an empty workload") {
    o.num_prompts = 0;
    CHECK(workload(o).empty());
  }
}

TEST_CASE("dataset names are the command line's", "[bench]") {
  CHECK(bench::parse_dataset("random") == Dataset::random);
  CHECK(bench::parse_dataset("anyscale") == Dataset::anyscale);
  CHECK(bench::parse_dataset("shared-prefix") == Dataset::shared_prefix);
  CHECK_FALSE(bench::parse_dataset("sharegpt"));
}
