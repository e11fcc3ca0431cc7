#include "model/prompt_logprobs.hpp"

#include <algorithm>

namespace troupe::model {

PromptLogprob score_prompt_token(std::span<const float> logits, TokenId target,
                                 std::int32_t top_n) {
  PromptLogprob out;
  out.token = target;
  const float own = logits[static_cast<std::size_t>(target)];
  // As Sampler::sample computes a sampled token's: the same bits for the same logits.
  const double lse = log_sum_exp(logits);
  out.logprob = static_cast<float>(own - lse);
  // One pass for the rank and the n most likely, kept sorted as top_logprobs() sorts
  // (larger first, ties by lower id): a row of the vocabulary's size is never copied.
  const auto n = static_cast<std::size_t>(std::clamp<std::int32_t>(top_n, 0, 1 << 20));
  std::vector<std::pair<float, TokenId>> top;
  top.reserve(n + 1);
  std::int32_t greater = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float l = logits[i];
    greater += l > own ? 1 : 0;
    // A later id never beats an equal value: it must be strictly larger to enter.
    if (n == 0 || (top.size() == n && !(l > top.back().first))) continue;
    auto at =
        std::upper_bound(top.begin(), top.end(), l,
                         [](float v, const std::pair<float, TokenId>& t) { return v > t.first; });
    top.insert(at, {l, static_cast<TokenId>(i)});
    if (top.size() > n) top.pop_back();
  }
  out.rank = 1 + greater;
  out.top_logprobs.reserve(top.size());
  for (const auto& [l, id] : top) out.top_logprobs.push_back({id, static_cast<float>(l - lse)});
  return out;
}

}  // namespace troupe::model
