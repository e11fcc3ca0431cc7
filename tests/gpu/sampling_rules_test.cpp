// The device sampler's kept set against the CPU sampler's rules, without a device: a host
// model of sample_kernel's selection (the same keys, radix digits, boundary groups and ranks,
// from gpu/sampling_rules.hpp, which the kernel compiles too) against
// model::Sampler::kept_tokens. Top-k and min-p must agree exactly; top-p too, but where a
// partial sum of the CPU's walk lies within float rounding of its target (the kernel's
// histogram bins hold float sums of their tokens, the CPU sums each token in double).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "gpu/sampling_rules.hpp"
#include "model/sampler.hpp"

using namespace troupe;
namespace rules = troupe::gpu::sampling_rules;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct RowParams {
  float temperature = 1.0f;
  std::int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
};

// What the kernel keeps: the tokens its draw can choose, in token order.
struct DeviceKept {
  std::vector<TokenId> ids;
  bool out_of_reach = false;  // rounding missed top-p's target: the cut kept all of its pool
};

float max_candidate(std::span<const float> x) {
  float best = -kInf;
  for (const float v : x) best = std::max(best, rules::is_candidate(v) ? v : -kInf);
  return best;
}

// sample_kernel's select_cut, serially: the same histograms, summed in token order where the
// kernel's atomics sum in any.
rules::RadixSelect radix_select(std::span<const float> x, float max, float inverse_temperature,
                                float top_k_count, float top_p, rules::Cut top_k, float min_p) {
  const bool by_mass = top_p >= 0.0f;
  const float w_group = rules::weight(rules::key_logit(top_k.key), max, inverse_temperature);
  const std::int32_t group = by_mass ? rules::group_size(top_k, min_p, w_group) : 0;
  rules::RadixSelect s = rules::radix_start(top_k_count);
  for (int digit = 0; digit < rules::kDigits; ++digit) {
    std::array<std::int32_t, rules::kBins> count{};
    std::array<float, rules::kBins> mass{};
    for (const float v : x) {
      float w = 0.0f;
      const int bin =
          rules::histogram_bin(s, by_mass, top_k, min_p, v, max, inverse_temperature, w);
      if (bin < 0) continue;
      if (by_mass) mass[bin] += w;
      ++count[bin];
    }
    if (group > 0 && rules::under_prefix(s, top_k.key)) {
      const int bin = rules::bin_of(s, top_k.key);
      count[bin] += group;
      mass[bin] += static_cast<float>(group) * w_group;
    }
    if (by_mass && digit == 0) s.remaining = rules::top_p_target(count.data(), mass.data(), top_p);
    rules::choose_digit(s, count.data(), by_mass ? mass.data() : nullptr);
  }
  return s;
}

// sample_kernel's kept set: the cut, then the draw's scan in token order ranking the tokens
// of the cut's key.
DeviceKept device_kept(std::span<const float> x, const RowParams& p) {
  DeviceKept out;
  const float max = max_candidate(x);
  if (max == -kInf) return out;  // the kernel answers the argmax's fallback, id 0
  const float inverse_temperature = 1.0f / p.temperature;
  const auto vocab = static_cast<std::int32_t>(x.size());
  rules::Cut cut{0u, 0};
  if (p.top_k > 0 && p.top_k < vocab) {
    cut = rules::top_k_cut(
        radix_select(x, max, inverse_temperature, static_cast<float>(p.top_k), -1.0f, cut, 0.0f));
  }
  if (p.top_p < 1.0f) {
    const auto s = radix_select(x, max, inverse_temperature, 0.0f, p.top_p, cut, p.min_p);
    out.out_of_reach = std::isinf(s.remaining);
    cut = rules::top_p_cut(s, rules::weight(rules::key_logit(s.prefix), max, inverse_temperature));
  }
  std::int32_t rank = 0;
  for (std::int32_t i = 0; i < vocab; ++i) {
    const float w = rules::weight(x[i], max, inverse_temperature);
    const std::uint32_t key = rules::logit_key(x[i]);
    if (rules::kept(cut, p.min_p, key, w, rank)) out.ids.push_back(i);
    if (rules::is_candidate(x[i]) && key == cut.key) ++rank;
  }
  return out;
}

// What the CPU keeps, less the tokens of no weight (a draw never reaches them), in token order.
std::vector<TokenId> cpu_kept(std::span<const float> x, const RowParams& p) {
  SamplingParams params;
  params.temperature = p.temperature;
  params.top_k = p.top_k;
  params.top_p = p.top_p;
  params.min_p = p.min_p;
  params.seed = 1;
  auto sampler = model::Sampler::create(params, {}, {}, static_cast<std::int32_t>(x.size()));
  REQUIRE(sampler.has_value());
  const float max = max_candidate(x);
  std::vector<TokenId> ids;
  for (const TokenId id : sampler->kept_tokens(x)) {
    if (rules::weight(x[id], max, 1.0f / p.temperature) > 0.0f) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The CPU's order: logit descending, lowest id first among equals.
std::vector<TokenId> cpu_order(std::span<const float> x, std::vector<TokenId> ids) {
  std::sort(ids.begin(), ids.end(),
            [&](TokenId a, TokenId b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  return ids;
}

std::vector<TokenId> sorted_prefix(const std::vector<TokenId>& order, std::size_t n) {
  std::vector<TokenId> ids(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Holds the device's kept set to the CPU's: equal, but for a top-p cut whose partial sums come
// within float rounding of the target. Returns whether they were equal.
bool check_kept(std::span<const float> x, const RowParams& p) {
  const DeviceKept device = device_kept(x, p);
  const std::vector<TokenId> cpu = cpu_kept(x, p);
  if (p.top_p >= 1.0f || device.ids == cpu) {
    CHECK(device.ids == cpu);
    return device.ids == cpu;
  }
  // Top-k and min-p agree exactly: the pool top-p cuts is the same on both sides.
  RowParams pool_params = p;
  pool_params.top_p = 1.0f;
  const std::vector<TokenId> pool = cpu_kept(x, pool_params);
  REQUIRE(device_kept(x, pool_params).ids == pool);
  // Both keep a prefix of the CPU's order of the pool...
  const std::vector<TokenId> order = cpu_order(x, pool);
  REQUIRE(sorted_prefix(order, cpu.size()) == cpu);
  REQUIRE(sorted_prefix(order, device.ids.size()) == device.ids);
  // ...ending apart only where a partial sum is within rounding of the target: the kernel's
  // bins are float sums of up to n terms, each off by at most about n * 2^-24 of the total.
  const float max = max_candidate(x);
  std::vector<double> cumulative(order.size() + 1, 0.0);
  for (std::size_t i = 0; i < order.size(); ++i) {
    cumulative[i + 1] = cumulative[i] + rules::weight(x[order[i]], max, 1.0f / p.temperature);
  }
  const double total = cumulative.back();
  const double target = static_cast<double>(p.top_p) * total;
  const double tolerance = 4.0 * static_cast<double>(order.size()) * std::ldexp(1.0, -24) * total;
  const std::size_t n_cpu = cpu.size(), n_device = device.ids.size();
  INFO("vocab " << x.size() << ", pool " << pool.size() << ", CPU keeps " << n_cpu << ", device "
                << n_device << ", target " << target << " of " << total);
  if (n_device < n_cpu) {
    CHECK(target - cumulative[n_device] <= tolerance);
  } else {
    CHECK(cumulative[n_device - 1] - target <= tolerance);
  }
  return false;
}

std::vector<float> uniform_row(std::size_t vocab, float value) {
  return std::vector<float>(vocab, value);
}

}  // namespace

TEST_CASE("a logit's key orders as the logit does, -0 and +0 alike", "[gpu][sampling]") {
  const std::vector<float> ascending = {-kInf,  -3e38f, -2.0f, -1.0f, -1e-30f, 0.0f,
                                        1e-30f, 1.0f,   2.5f,  3e38f, kInf};
  for (std::size_t i = 1; i < ascending.size(); ++i) {
    CHECK(rules::logit_key(ascending[i - 1]) < rules::logit_key(ascending[i]));
    CHECK(rules::key_logit(rules::logit_key(ascending[i])) == ascending[i]);
  }
  CHECK(rules::logit_key(-0.0f) == rules::logit_key(0.0f));
  CHECK(rules::logit_key(-kInf) > 0u);  // key 0 is no candidate's: the "keep all" cut
  CHECK_FALSE(rules::is_candidate(kNaN));
  CHECK_FALSE(rules::is_candidate(-kInf));
  CHECK(rules::weight(kNaN, 0.0f, 1.0f) == 0.0f);
}

TEST_CASE("a digit that misses its target takes the lowest bin, and so does every later one",
          "[gpu][sampling]") {
  std::array<std::int32_t, rules::kBins> count{};
  std::array<float, rules::kBins> mass{};
  count[200] = 1, mass[200] = 1.0f;
  count[17] = 3, mass[17] = 0.5f;
  count[9] = 2, mass[9] = 0.25f;
  auto s = rules::radix_start(1.25f);
  rules::choose_digit(s, count.data(), mass.data());
  CHECK(s.prefix == 17u << 24);
  CHECK(s.remaining == 0.25f);
  s = rules::radix_start(1.8f);  // beyond the 1.75 there is
  rules::choose_digit(s, count.data(), mass.data());
  CHECK(s.prefix == 9u << 24);
  CHECK(std::isinf(s.remaining));
  rules::choose_digit(s, count.data(), mass.data());
  CHECK(s.prefix == (9u << 24 | 9u << 16));
  // By count: the digit holding the k-th, and how far into it.
  s = rules::radix_start(3.0f);
  rules::choose_digit(s, count.data(), nullptr);
  CHECK(s.prefix == 17u << 24);
  CHECK(s.remaining == 2.0f);
}

TEST_CASE("top-k keeps exactly k at a tie with the k-th, the lowest ids", "[gpu][sampling]") {
  std::vector<float> x(100);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -2.0f - 0.01f * static_cast<float>(i);
  for (const TokenId id : {50, 10, 90}) x[id] = 5.0f;
  for (const TokenId id : {3, 17, 20, 44, 61, 62, 70, 99}) x[id] = 2.0f;
  RowParams p;
  p.top_k = 6;
  CHECK(device_kept(x, p).ids == std::vector<TokenId>{3, 10, 17, 20, 50, 90});
  CHECK(cpu_kept(x, p) == std::vector<TokenId>{3, 10, 17, 20, 50, 90});
  p.top_k = 2;
  CHECK(device_kept(x, p).ids == std::vector<TokenId>{10, 50});
  CHECK(cpu_kept(x, p) == std::vector<TokenId>{10, 50});
  p.top_k = 11;
  CHECK(check_kept(x, p));
  CHECK(device_kept(x, p).ids.size() == 11);
}

TEST_CASE("weights that round equal are no tie: the higher logit comes first", "[gpu][sampling]") {
  // Each weighs exactly 1.0f, but the CPU orders them by logit: 1, 0, 2.
  const std::vector<float> x = {-1e-9f, 0.0f, -2e-9f};
  RowParams p;
  p.top_k = 1;
  CHECK(device_kept(x, p).ids == std::vector<TokenId>{1});
  CHECK(cpu_kept(x, p) == std::vector<TokenId>{1});
  p.top_k = 2;
  CHECK(device_kept(x, p).ids == std::vector<TokenId>{0, 1});
  CHECK(cpu_kept(x, p) == std::vector<TokenId>{0, 1});
  p.top_k = 0;
  p.top_p = 0.5f;  // a target of 1.5: the second in order reaches it
  CHECK(device_kept(x, p).ids == std::vector<TokenId>{0, 1});
  CHECK(cpu_kept(x, p) == std::vector<TokenId>{0, 1});
}

TEST_CASE("all-equal logits keep the lowest ids, by top-k, top-p and both", "[gpu][sampling]") {
  const auto x = uniform_row(1000, -3.0f);
  auto first = [](std::int32_t n) {
    std::vector<TokenId> ids(static_cast<std::size_t>(n));
    for (std::int32_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = i;
    return ids;
  };
  RowParams p;
  p.temperature = 0.7f;
  SECTION("top-k") {
    p.top_k = 37;
    CHECK(device_kept(x, p).ids == first(37));
    CHECK(cpu_kept(x, p) == first(37));
  }
  SECTION("top-p reaching its target exactly at a token") {
    p.top_p = 0.25f;  // 250 of 1000
    CHECK(device_kept(x, p).ids == first(250));
    CHECK(cpu_kept(x, p) == first(250));
  }
  SECTION("top-p between tokens") {
    p.top_p = 0.2505f;  // 250.49...: the 251st reaches it
    CHECK(device_kept(x, p).ids == first(251));
    CHECK(cpu_kept(x, p) == first(251));
  }
  SECTION("top-k, then top-p of what it kept") {
    p.top_k = 37;
    p.top_p = 0.5f;  // 18.5 of 37
    CHECK(device_kept(x, p).ids == first(19));
    CHECK(cpu_kept(x, p) == first(19));
  }
  SECTION("min_p 1 keeps every token of weight 1") {
    p.min_p = 1.0f;
    CHECK(device_kept(x, p).ids == first(1000));
    CHECK(cpu_kept(x, p) == first(1000));
  }
}

TEST_CASE("top-p's cut inside a tie takes its lowest ids", "[gpu][sampling]") {
  std::vector<float> x(200, -4.0f);
  for (TokenId id = 150; id < 154; ++id) x[static_cast<std::size_t>(id)] = 1.0f;
  std::vector<TokenId> tied;
  for (TokenId id = 0; id < 200 && tied.size() < 60; id += 3) {
    if (x[static_cast<std::size_t>(id)] != 1.0f) {
      x[static_cast<std::size_t>(id)] = 0.0f;
      tied.push_back(id);
    }
  }
  for (const float top_p : {0.2f, 0.5f, 0.77f, 0.9f}) {
    INFO("top_p " << top_p);
    RowParams p;
    p.top_p = top_p;
    const auto kept = device_kept(x, p).ids;
    CHECK(kept == cpu_kept(x, p));
    // The four at 1.0 and the first n of the tie, 0 < n < 60.
    std::vector<TokenId> at_tie;
    for (const TokenId id : kept) {
      if (x[static_cast<std::size_t>(id)] == 0.0f) at_tie.push_back(id);
    }
    CHECK(kept.size() == 4 + at_tie.size());
    CHECK(!at_tie.empty());
    CHECK(at_tie.size() < tied.size());
    CHECK(at_tie == std::vector<TokenId>(tied.begin(), tied.begin() + at_tie.size()));
  }
}

TEST_CASE("top-k, min-p and top-p together cut where the CPU cuts", "[gpu][sampling]") {
  std::vector<float> x(300);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> low(-9.0f, -3.0f);
  for (float& v : x) v = low(rng);
  std::vector<TokenId> top, second;
  for (TokenId id = 5; id < 300 && top.size() < 20; id += 7) top.push_back(id);
  for (TokenId id = 2; id < 300 && second.size() < 30; id += 5) {
    if (std::find(top.begin(), top.end(), id) == top.end()) second.push_back(id);
  }
  for (const TokenId id : top) x[static_cast<std::size_t>(id)] = 3.0f;
  for (const TokenId id : second) x[static_cast<std::size_t>(id)] = 2.0f;
  auto expect = [&](std::size_t from_top, std::size_t from_second) {
    std::vector<TokenId> ids(top.begin(), top.begin() + static_cast<std::ptrdiff_t>(from_top));
    ids.insert(ids.end(), second.begin(),
               second.begin() + static_cast<std::ptrdiff_t>(from_second));
    std::sort(ids.begin(), ids.end());
    return ids;
  };
  RowParams p;
  p.top_k = 25;               // the 20 at 3.0 and the 5 lowest ids at 2.0
  p.min_p = std::exp(-1.5f);  // 2.0 weighs e^-1: kept
  CHECK(device_kept(x, p).ids == expect(20, 5));
  CHECK(cpu_kept(x, p) == expect(20, 5));
  p.top_p = 0.9f;  // 19.66 of 21.84: the 20 at 3.0
  CHECK(device_kept(x, p).ids == expect(20, 0));
  CHECK(cpu_kept(x, p) == expect(20, 0));
  p.top_p = 0.95f;  // 20.75: and 3 of the second
  CHECK(device_kept(x, p).ids == expect(20, 3));
  CHECK(cpu_kept(x, p) == expect(20, 3));
  p.min_p = 0.5f;  // the second gone: 19 of 20, the lowest ids at 3.0
  CHECK(device_kept(x, p).ids == expect(19, 0));
  CHECK(cpu_kept(x, p) == expect(19, 0));
}

TEST_CASE("NaN and -inf are never kept, a row of neither keeps nothing", "[gpu][sampling]") {
  std::vector<float> x = {kNaN, -kInf, 1.0f, kNaN, 1.0f, -kInf, 0.5f, -0.0f, kNaN, 0.0f};
  for (const std::int32_t top_k : {0, 1, 2, 3, 5, 8, 20}) {
    for (const float top_p : {1.0f, 0.6f, 0.1f}) {
      RowParams p;
      p.top_k = top_k;
      p.top_p = top_p;
      INFO("top_k " << top_k << ", top_p " << top_p);
      CHECK(check_kept(x, p));
      for (const TokenId id : device_kept(x, p).ids) {
        CHECK(rules::is_candidate(x[static_cast<std::size_t>(id)]));
      }
    }
  }
  RowParams p;
  p.top_k = 2;
  CHECK(device_kept(x, p).ids == std::vector<TokenId>{2, 4});
  p.top_k = 5;  // -0 and +0 are one logit: the lower id first
  CHECK(device_kept(x, p).ids == std::vector<TokenId>{2, 4, 6, 7, 9});
  p.top_k = 4;
  CHECK(device_kept(x, p).ids == std::vector<TokenId>{2, 4, 6, 7});
  CHECK(cpu_kept(x, p) == std::vector<TokenId>{2, 4, 6, 7});
  for (const float fill : {kNaN, -kInf}) {
    const auto none = uniform_row(16, fill);
    CHECK(device_kept(none, p).ids.empty());
    CHECK(cpu_kept(none, p).empty());
  }
}

TEST_CASE("k at or beyond the candidates keeps them all", "[gpu][sampling]") {
  std::vector<float> x(50);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<float>(i));
  for (const std::int32_t top_k : {49, 50, 51, 1000}) {
    RowParams p;
    p.top_k = top_k;
    CHECK(check_kept(x, p));
    CHECK(device_kept(x, p).ids.size() == static_cast<std::size_t>(std::min(top_k, 50)));
  }
  for (std::size_t i = 0; i < 40; ++i) x[i] = -kInf;  // 10 candidates left
  RowParams p;
  p.top_k = 20;
  CHECK(check_kept(x, p));
  CHECK(device_kept(x, p).ids.size() == 10);
}

TEST_CASE("a top-p target that rounding puts out of reach keeps the whole pool",
          "[gpu][sampling]") {
  // The most likely token and 2000 at weights in (e^-2, e^-1]: the first digit sums their
  // bin in token order, the second its sub-bins one by one, and those float sums differ by
  // more than what top_p = 1 - 2^-24 leaves out. The CPU, whose tail cannot hold so little,
  // keeps all too.
  const float top_p = std::nextafter(1.0f, 0.0f);
  int out_of_reach = 0;
  for (std::uint32_t seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> tail(-2.0f, -1.0f);
    std::vector<float> x(2001);
    for (float& v : x) v = tail(rng);
    x[seed * 37 % x.size()] = 0.0f;
    RowParams p;
    p.top_p = top_p;
    const auto device = device_kept(x, p);
    if (!device.out_of_reach) continue;
    ++out_of_reach;
    CHECK(device.ids.size() == x.size());
    CHECK(check_kept(x, p));
  }
  CHECK(out_of_reach > 0);
}

TEST_CASE("on random rows the device keeps what the CPU keeps", "[gpu][sampling]") {
  std::mt19937 rng(2024);
  auto pick = [&](auto... values) {
    const std::array<std::common_type_t<decltype(values)...>, sizeof...(values)> all{values...};
    return all[std::uniform_int_distribution<std::size_t>(0, all.size() - 1)(rng)];
  };
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  int rows = 0, equal = 0;
  for (int n = 0; n < 3000; ++n) {
    const std::size_t vocab = pick(1, 2, 7, 64, 300, 1000, 3000);
    const int kind = pick(0, 1, 2, 3, 4);
    const float scale = pick(0.5f, 2.0f, 8.0f);
    std::vector<float> x(vocab);
    for (float& v : x) {
      v = normal(rng) * scale;
      if (kind == 1) v = std::round(v * 2.0f) / 2.0f;      // few values: ties everywhere
      if (kind == 2) v = pick(0.0f, -1.0f, -2.5f, -0.0f);  // three levels
      if (kind == 3 && unit(rng) < 0.1f) v = pick(kNaN, -kInf, -1e30f, 0.0f, -0.0f);
    }
    if (kind == 4) x[static_cast<std::size_t>(rng() % vocab)] = 12.0f;  // one far ahead
    RowParams p;
    p.temperature = pick(0.05f, 0.5f, 1.0f, 2.0f);
    const auto v = static_cast<std::int32_t>(vocab);
    p.top_k = pick(0, 0, 1, 2, 3, 10, 100, v - 1, v, v + 5);
    p.top_p = pick(1.0f, 1.0f, std::nextafter(1.0f, 0.0f), 0.95f, 0.7f, 0.3f, 0.05f);
    p.min_p = pick(0.0f, 0.0f, 1e-4f, 0.05f, 0.3f, 1.0f);
    INFO("row " << n << ": kind " << kind << ", T " << p.temperature << ", top_k " << p.top_k
                << ", top_p " << p.top_p << ", min_p " << p.min_p);
    ++rows;
    if (check_kept(x, p)) ++equal;
  }
  // Cuts within rounding of their target are rare in such rows (3 of 3000 when written, all
  // at top_p = 1 - 2^-24).
  INFO(equal << " of " << rows << " rows equal");
  CHECK(equal >= rows * 995 / 1000);
}
