// When a sequence ends on a token: an end-of-generation or stop token id once
// min_tokens are out, or max_tokens reached. The engine's one place for it;
// the sampler only masks those ids until min_tokens (that is sampling).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <span>
#include <vector>

#include "troupe/sampling.hpp"

namespace troupe::engine {

class StopRule {
 public:
  StopRule() = default;
  // `end_of_generation`: the vocabulary's EOS-like ids (dropped when params.ignore_eos).
  StopRule(const SamplingParams& params, std::span<const TokenId> end_of_generation)
      : stop_ids_(params.stop_token_ids),
        min_tokens_(params.min_tokens),
        max_tokens_(params.max_tokens) {
    if (!params.ignore_eos)
      stop_ids_.insert(stop_ids_.end(), end_of_generation.begin(), end_of_generation.end());
  }

  // Why the sequence ends now that `token` is its `num_generated`-th generated token.
  FinishReason after(TokenId token, std::int32_t num_generated) const {
    if (num_generated >= min_tokens_ &&
        std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
      return FinishReason::stop;
    }
    return num_generated >= max_tokens_ ? FinishReason::length : FinishReason::none;
  }

  std::int32_t max_tokens() const { return max_tokens_; }

 private:
  std::vector<TokenId> stop_ids_;
  std::int32_t min_tokens_ = 0;
  std::int32_t max_tokens_ = INT32_MAX;
};

}  // namespace troupe::engine
