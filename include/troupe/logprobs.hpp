// Log-probabilities as a request receives them: of a token, and of a prompt token given
// the tokens before it. The sampler and the prompt scorer produce these; the API renders them.
#pragma once

#include <cstdint>
#include <vector>

#include "troupe/types.hpp"

namespace troupe {

struct TokenLogprob {
  TokenId id = kNoToken;
  float logprob = 0.0f;

  bool operator==(const TokenLogprob&) const = default;
};

// A prompt token's log-probability given the tokens before it (SamplingParams::
// prompt_logprobs): its rank among the vocabulary (1 + the number of tokens with a strictly
// greater logit) and the n most likely tokens at its position.
struct PromptLogprob {
  TokenId token = kNoToken;
  float logprob = 0.0f;
  std::int32_t rank = 0;
  std::vector<TokenLogprob> top_logprobs;

  bool operator==(const PromptLogprob&) const = default;
};

}  // namespace troupe
