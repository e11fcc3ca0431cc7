// Test steps: sequences with their own runs of KV blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/step_input.hpp"

namespace troupe::test {

// Sequence s has lengths[s] tokens, the last new_tokens[s] of them in this step; its
// blocks follow the previous sequence's (first_block onwards).
inline model::StepInput make_step(const std::vector<std::int32_t>& lengths,
                                  const std::vector<std::int32_t>& new_tokens,
                                  std::int32_t block_size, bool all_logits = true,
                                  const std::vector<TokenId>& tokens = {}) {
  model::StepInput step;
  std::int32_t max_blocks = 0;
  for (auto l : lengths) max_blocks = std::max(max_blocks, (l + block_size - 1) / block_size);
  step.max_blocks_per_seq = max_blocks;
  std::int32_t next_block = 0;
  std::size_t next_token = 0;
  for (std::size_t s = 0; s < lengths.size(); ++s) {
    std::vector<std::int32_t> table(max_blocks, 0);
    for (std::int32_t b = 0; b < (lengths[s] + block_size - 1) / block_size; ++b) {
      table[b] = next_block++;
    }
    std::vector<TokenId> ids(new_tokens[s]);
    for (auto& id : ids) {
      id = next_token < tokens.size() ? tokens[next_token] : static_cast<TokenId>(10 + s);
      ++next_token;
    }
    model::append_sequence(step, ids, lengths[s] - new_tokens[s], table, all_logits);
  }
  return step;
}

}  // namespace troupe::test
