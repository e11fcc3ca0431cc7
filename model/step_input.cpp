#include "model/step_input.hpp"

#include <algorithm>
#include <string>

namespace troupe::model {

namespace {

Error bad_step(const std::string& what) {
  return Error{ErrorCode::invalid_argument, "invalid step: " + what};
}

}  // namespace

Result<void> validate_step(const StepInput& step, const KvCacheShape& cache,
                           std::int32_t vocab_size) {
  const std::int32_t num_tokens = step.num_tokens();
  const std::int32_t num_seqs = step.num_seqs();
  if (num_seqs == 0 && num_tokens == 0 && step.query_start.size() <= 1 && step.logit_rows.empty()) {
    return {};  // an empty step: nothing to run
  }
  if (step.positions.size() != step.tokens.size()) {
    return tl::unexpected(bad_step("positions and tokens differ in length"));
  }
  if (step.query_start.size() != static_cast<std::size_t>(num_seqs) + 1 ||
      step.query_start.front() != 0 || step.query_start.back() != num_tokens) {
    return tl::unexpected(bad_step("query_start must run from 0 to the token count"));
  }
  if (step.max_blocks_per_seq < 0 ||
      step.block_tables.size() !=
          static_cast<std::size_t>(num_seqs) * static_cast<std::size_t>(step.max_blocks_per_seq)) {
    return tl::unexpected(bad_step("block_tables is not num_seqs x max_blocks_per_seq"));
  }
  for (TokenId t : step.tokens) {
    if (t < 0 || t >= vocab_size) {
      return tl::unexpected(bad_step("token " + std::to_string(t) +
                                     " is outside the vocabulary of " +
                                     std::to_string(vocab_size)));
    }
  }
  for (std::int32_t s = 0; s < num_seqs; ++s) {
    const std::int32_t begin = step.query_start[s];
    const std::int32_t end = step.query_start[s + 1];
    const std::int32_t context = step.context_lens[s];
    if (end < begin)
      return tl::unexpected(bad_step("query_start decreases at sequence " + std::to_string(s)));
    const std::int32_t num_blocks_needed = (context + cache.block_size - 1) / cache.block_size;
    if (context < end - begin || num_blocks_needed > step.max_blocks_per_seq) {
      return tl::unexpected(bad_step("sequence " + std::to_string(s) + " has context " +
                                     std::to_string(context) +
                                     " that its queries or blocks do not fit"));
    }
    for (std::int32_t i = begin; i < end; ++i) {
      // Queries are the newest tokens of their sequence, in order.
      if (step.positions[i] != context - (end - i)) {
        return tl::unexpected(
            bad_step("sequence " + std::to_string(s) + " has a token at an unexpected position"));
      }
    }
    const auto table = step.block_table(s);
    for (std::int32_t b = 0; b < num_blocks_needed; ++b) {
      if (table[b] < 0 || table[b] >= cache.num_blocks) {
        return tl::unexpected(bad_step("sequence " + std::to_string(s) + " names KV block " +
                                       std::to_string(table[b]) + " of " +
                                       std::to_string(cache.num_blocks)));
      }
    }
  }
  for (std::int32_t row : step.logit_rows) {
    if (row < 0 || row >= num_tokens)
      return tl::unexpected(bad_step("a logit row is outside the batch"));
  }
  if (!step.adapters.empty() && step.adapters.size() != static_cast<std::size_t>(num_seqs)) {
    return tl::unexpected(bad_step("adapters is neither empty nor one slot per sequence"));
  }
  for (std::int32_t slot : step.adapters) {
    if (slot < 0) return tl::unexpected(bad_step("an adapter slot is negative"));
  }
  return {};
}

void append_sequence(StepInput& step, std::span<const TokenId> tokens, std::int32_t first_position,
                     std::span<const std::int32_t> block_table, bool wants_logits,
                     std::int32_t adapter) {
  if (step.query_start.empty()) step.query_start.push_back(0);
  // Slots stay an empty list while every sequence runs the base model.
  if (adapter != 0 || !step.adapters.empty()) {
    step.adapters.resize(static_cast<std::size_t>(step.num_seqs()), 0);
    step.adapters.push_back(adapter);
  }
  const auto n = static_cast<std::int32_t>(tokens.size());
  for (std::int32_t i = 0; i < n; ++i) {
    step.tokens.push_back(tokens[i]);
    step.positions.push_back(first_position + i);
  }
  step.query_start.push_back(step.num_tokens());
  step.context_lens.push_back(first_position + n);
  // Widen every table when this one is longer; pad with block 0 (never read).
  const auto width = std::max<std::int32_t>(step.max_blocks_per_seq,
                                            static_cast<std::int32_t>(block_table.size()));
  if (width != step.max_blocks_per_seq) {
    std::vector<std::int32_t> widened;
    const std::int32_t previous = step.num_seqs() - 1;
    widened.reserve(static_cast<std::size_t>(width) * (previous + 1));
    for (std::int32_t s = 0; s < previous; ++s) {
      const auto row = step.block_table(s);
      widened.insert(widened.end(), row.begin(), row.end());
      widened.insert(widened.end(), width - step.max_blocks_per_seq, 0);
    }
    step.block_tables = std::move(widened);
    step.max_blocks_per_seq = width;
  }
  step.block_tables.insert(step.block_tables.end(), block_table.begin(), block_table.end());
  step.block_tables.insert(step.block_tables.end(), width - block_table.size(), 0);
  if (wants_logits && n > 0) step.logit_rows.push_back(step.num_tokens() - 1);
}

}  // namespace troupe::model
