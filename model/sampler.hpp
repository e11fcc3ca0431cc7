// Chooses a sequence's next token from its logits: penalties, temperature,
// top-k / top-p / min-p, a per-sequence seeded generator, log-probabilities,
// and min_tokens (end-of-generation and stop ids masked until then). Whether a
// sequence has ended is the engine's to say (engine/stop_rule.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "troupe/result.hpp"
#include "troupe/sampling.hpp"

namespace troupe::model {

struct TokenLogprob {
  TokenId id = kNoToken;
  float logprob = 0.0f;

  bool operator==(const TokenLogprob&) const = default;
};

struct SampledToken {
  TokenId id = kNoToken;
  float logprob = 0.0f;                    // of the chosen token, under the model's distribution
  std::vector<TokenLogprob> top_logprobs;  // the n most likely, when asked

  bool operator==(const SampledToken&) const = default;
};

// One row's parameters for sampling on the device (no penalties, no log-probabilities).
struct DeviceSamplingRow {
  float temperature = 1.0f;  // 0: greedy
  std::int32_t top_k = 0;    // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  std::uint64_t seed = 0;     // with `counter`, the row's random draw
  std::uint64_t counter = 0;  // tokens the sequence has drawn so far
};

class Sampler {
 public:
  // Checks the parameters; `end_of_generation` are the vocabulary's EOS-like ids.
  static Result<Sampler> create(const SamplingParams& params, std::span<const TokenId> prompt,
                                std::vector<TokenId> end_of_generation, std::int32_t vocab_size);

  // Picks the next token from one row of logits [vocab_size]; records it.
  SampledToken sample(std::span<const float> logits);

  // The next draw as a device can make it, or nothing when it needs the host: penalties,
  // log-probabilities, or stop tokens still masked by min_tokens.
  std::optional<DeviceSamplingRow> device_row() const;
  // Records a token chosen elsewhere (on the device) from device_row()'s parameters.
  SampledToken accept(TokenId id);

  std::int32_t num_generated() const { return static_cast<std::int32_t>(output_.size()); }
  const std::vector<TokenId>& output() const { return output_; }

 private:
  Sampler() = default;
  void apply_penalties(std::vector<float>& logits) const;
  TokenId choose(std::vector<float>& logits);
  void record(TokenId id);

  SamplingParams params_;
  std::int32_t vocab_size_ = 0;
  std::vector<TokenId> end_of_generation_;
  std::unordered_map<TokenId, std::int32_t> prompt_counts_;
  std::unordered_map<TokenId, std::int32_t> output_counts_;
  std::vector<TokenId> output_;
  std::mt19937_64 rng_;
  std::uint64_t device_seed_ = 0;
  std::vector<float> scratch_;
  std::vector<std::pair<float, TokenId>> candidates_;
  std::vector<double> probs_;
};

// log-softmax of one row, and its n largest entries (ties: lowest id first).
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, std::int32_t n);

}  // namespace troupe::model
