#include "engine/step_builder.hpp"

#include <algorithm>
#include <span>

namespace troupe::engine {

model::StepInput build_step_input(const BatchPlan& plan, const Scheduler& scheduler,
                                  std::vector<SeqId>* sampled_ids,
                                  std::vector<model::PromptRows>* prompt_rows) {
  model::StepInput step;
  if (sampled_ids != nullptr) sampled_ids->clear();
  if (prompt_rows != nullptr) prompt_rows->clear();
  std::vector<std::int32_t> scoring_rows;  // flat-batch rows, appended after the sampled ones
  for (const ScheduledChunk& chunk : plan.chunks) {
    const Sequence* seq = scheduler.find(chunk.id);
    TROUPE_ASSERT(seq != nullptr, "a planned sequence is gone");
    const std::int32_t first = seq->num_computed_tokens;
    const std::span<const TokenId> tokens(seq->tokens.data() + first,
                                          static_cast<std::size_t>(chunk.num_new_tokens));
    const std::int32_t first_row = step.num_tokens();
    model::append_sequence(step, tokens, first, seq->block_table, chunk.samples);
    if (chunk.samples && sampled_ids != nullptr) sampled_ids->push_back(chunk.id);
    if (prompt_rows == nullptr || !seq->scores_prompt()) continue;
    // Rows at positions [first, end) score the prompt tokens at first + 1 .. end.
    const std::int32_t end = std::min(first + chunk.num_new_tokens, seq->num_prompt_tokens - 1);
    if (end <= first) continue;
    model::PromptRows rows;
    rows.id = chunk.id;
    rows.first_position = first;
    rows.top_n = *seq->prompt_logprobs;
    rows.targets.assign(seq->tokens.begin() + first + 1, seq->tokens.begin() + end + 1);
    for (std::int32_t p = first; p < end; ++p) scoring_rows.push_back(first_row + (p - first));
    prompt_rows->push_back(std::move(rows));
  }
  step.logit_rows.insert(step.logit_rows.end(), scoring_rows.begin(), scoring_rows.end());
  return step;
}

}  // namespace troupe::engine
