#include "model/prompt_logprobs.hpp"

namespace troupe::model {

PromptTokenLogprob score_prompt_token(std::span<const float> logits, TokenId target,
                                      std::int32_t top_n) {
  PromptTokenLogprob out;
  out.token = target;
  const float own = logits[static_cast<std::size_t>(target)];
  // As Sampler::sample computes a sampled token's: the same bits for the same logits.
  out.logprob = static_cast<float>(own - log_sum_exp(logits));
  std::int32_t greater = 0;
  for (const float l : logits) greater += l > own ? 1 : 0;
  out.rank = 1 + greater;
  if (top_n > 0) out.top_logprobs = top_logprobs(logits, top_n);
  return out;
}

}  // namespace troupe::model
