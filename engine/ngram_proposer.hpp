// Speculative decoding's n-gram proposer (prompt lookup; vLLM's `ngram` method): the
// last n tokens of a sequence (prompt and output) are looked up earlier in the same
// sequence, and the tokens that followed there are proposed as its next ones. No model
// runs: a proposal costs a scan of the sequence, and a sequence that never repeats
// itself gets none (its step is a plain decode).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "troupe/types.hpp"

namespace troupe::engine {

// Up to `max_tokens` proposed next tokens for `tokens`: for n from `max_n` down to
// `min_n`, the latest earlier occurrence of the last n tokens, and what followed it
// (past the sequence's end, the proposal repeats itself: a loop of period p proposes its
// next turns). Empty when no suffix of those lengths recurs.
std::vector<TokenId> propose_ngram(std::span<const TokenId> tokens, std::int32_t min_n,
                                   std::int32_t max_n, std::int32_t max_tokens);

}  // namespace troupe::engine
