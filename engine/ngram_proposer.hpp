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

// Speculative decoding as the scheduler runs it (EngineConfig::speculative).
struct SpeculationConfig {
  std::int32_t num_speculative_tokens = 0;  // k, the most tokens proposed a step; 0: off
  std::int32_t prompt_lookup_max = 0;       // the longest suffix looked up
  std::int32_t prompt_lookup_min = 1;       // the shortest
  // No proposals in a step whose decoding sequences are more than this: a large batch's
  // step is bound by compute, not by reading the weights once, and verifying k tokens
  // then costs about k tokens (vLLM's speculative_disable_by_batch_size).
  std::int32_t disable_by_batch_size = 4;
  // The worker's draft model proposes, not prompt lookup: a decode's draft is then k
  // placeholders the worker fills in, after the draft has run the tokens it has not seen.
  bool draft_model = false;

  bool enabled() const { return num_speculative_tokens > 0; }
  bool operator==(const SpeculationConfig&) const = default;
};

// Up to `max_tokens` proposed next tokens for `tokens`: for n from `max_n` down to
// `min_n`, the latest earlier occurrence of the last n tokens, and what followed it
// (past the sequence's end, the proposal repeats itself: a loop of period p proposes its
// next turns). Empty when no suffix of those lengths recurs.
std::vector<TokenId> propose_ngram(std::span<const TokenId> tokens, std::int32_t min_n,
                                   std::int32_t max_n, std::int32_t max_tokens);

}  // namespace troupe::engine
