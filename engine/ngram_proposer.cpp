#include "engine/ngram_proposer.hpp"

#include <algorithm>

namespace troupe::engine {

std::vector<TokenId> propose_ngram(std::span<const TokenId> tokens, std::int32_t min_n,
                                   std::int32_t max_n, std::int32_t max_tokens) {
  const auto size = static_cast<std::int64_t>(tokens.size());
  if (max_tokens <= 0 || min_n < 1) return {};
  for (std::int64_t n = std::min<std::int64_t>(max_n, size - 1); n >= min_n; --n) {
    const auto suffix = tokens.subspan(static_cast<std::size_t>(size - n));
    // The latest start i < size - n whose n tokens equal the suffix's: what followed it
    // is what the sequence did last time it was here.
    for (std::int64_t i = size - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) continue;
      // Past the sequence's end the proposal goes on as it began (a period shorter than
      // the proposal repeats): the token at `from + j` is the proposal's own.
      const std::int64_t from = i + n;
      std::vector<TokenId> proposal;
      proposal.reserve(static_cast<std::size_t>(max_tokens));
      for (std::int64_t at = from; at < from + max_tokens; ++at) {
        proposal.push_back(at < size ? tokens[static_cast<std::size_t>(at)]
                                     : proposal[static_cast<std::size_t>(at - size)]);
      }
      return proposal;
    }
  }
  return {};
}

}  // namespace troupe::engine
