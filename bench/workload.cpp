#include "bench/workload.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

namespace troupe::bench {

namespace {

// std::mt19937_64's sequence is fixed by the standard, the std:: distributions' algorithms are
// not (libstdc++ and libc++ differ), so the draws map its numbers by hand: the same workload
// whichever standard library a tool was built with.
class Draws {
 public:
  explicit Draws(std::uint64_t seed) : engine_(seed) {}

  // Uniform in [lo, hi]; the modulo's bias is below 2^-32 for any 32-bit range.
  std::int32_t uniform(std::int32_t lo, std::int32_t hi) {
    const auto span = static_cast<std::uint64_t>(std::int64_t{hi} - lo + 1);
    return static_cast<std::int32_t>(lo + static_cast<std::int64_t>(engine_() % span));
  }

  // Exponential with this mean, by inversion of a uniform in [0, 1) with 53 bits.
  double exponential(double mean) {
    const double u = static_cast<double>(engine_() >> 11) * 0x1p-53;
    return -mean * std::log1p(-u);
  }

 private:
  std::mt19937_64 engine_;
};

class Generator {
 public:
  explicit Generator(const WorkloadOptions& o) : o_(o), draws_(o.seed) {}

  std::vector<TokenId> tokens(std::int32_t n) {
    std::vector<TokenId> out(static_cast<std::size_t>(n));
    for (TokenId& t : out) t = draws_.uniform(kFirstPromptToken, o_.vocab_size - 1);
    return out;
  }

  // A length within mean * (1 - range_ratio) .. mean * (1 + range_ratio), at least 1.
  std::int32_t ranged(std::int32_t mean) {
    const auto lo = static_cast<std::int32_t>(std::floor(mean * (1.0 - o_.range_ratio)));
    const auto hi = static_cast<std::int32_t>(std::ceil(mean * (1.0 + o_.range_ratio)));
    return draws_.uniform(std::max(1, lo), std::max(1, hi));
  }

  // The Anyscale article's outputs: exponential with mean output_len, in 1 .. 4 * output_len.
  std::int32_t capped_exponential(std::int32_t mean) {
    return std::clamp(static_cast<std::int32_t>(std::lround(draws_.exponential(mean))), 1,
                      4 * mean);
  }

 private:
  const WorkloadOptions& o_;
  Draws draws_;
};

}  // namespace

std::optional<Dataset> parse_dataset(std::string_view name) {
  if (name == "random") return Dataset::random;
  if (name == "anyscale") return Dataset::anyscale;
  if (name == "shared-prefix") return Dataset::shared_prefix;
  return std::nullopt;
}

Result<std::vector<BenchRequest>> make_workload(const WorkloadOptions& o) {
  if (o.num_prompts < 0 || o.input_len <= 0 || o.output_len <= 0 || o.range_ratio < 0) {
    return make_error(ErrorCode::invalid_argument,
                      "a workload needs positive lengths and a range ratio of at least 0");
  }
  if (o.vocab_size <= kFirstPromptToken) {
    return make_error(ErrorCode::invalid_argument,
                      "prompt tokens are drawn from ids " + std::to_string(kFirstPromptToken) +
                          " up, but the vocabulary has " + std::to_string(o.vocab_size));
  }
  Generator g(o);
  // Only shared-prefix draws a system prompt, so that the other datasets do not depend on
  // prefix_len.
  const std::vector<TokenId> system_prompt = o.dataset == Dataset::shared_prefix
                                                 ? g.tokens(std::max(0, o.prefix_len))
                                                 : std::vector<TokenId>{};
  std::vector<BenchRequest> out(static_cast<std::size_t>(o.num_prompts));
  for (BenchRequest& r : out) {
    if (o.dataset == Dataset::anyscale) {
      r.prompt = g.tokens(o.input_len);
      r.output_len = g.capped_exponential(o.output_len);
      continue;
    }
    r.prompt = system_prompt;
    const std::vector<TokenId> own = g.tokens(g.ranged(o.input_len));
    r.prompt.insert(r.prompt.end(), own.begin(), own.end());
    r.output_len = g.ranged(o.output_len);
  }
  return out;
}

}  // namespace troupe::bench
