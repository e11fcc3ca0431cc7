#include "engine/step_builder.hpp"

#include <algorithm>
#include <span>

namespace troupe::engine {

model::StepInput build_step_input(const BatchPlan& plan, const Scheduler& scheduler,
                                  std::vector<SeqId>* sampled_ids,
                                  std::vector<model::PromptRows>* prompt_rows,
                                  std::vector<std::int32_t>* num_drafts,
                                  std::vector<model::DraftWork>* drafts) {
  model::StepInput step;
  if (sampled_ids != nullptr) sampled_ids->clear();
  if (prompt_rows != nullptr) prompt_rows->clear();
  if (num_drafts != nullptr) num_drafts->clear();
  if (drafts != nullptr) drafts->clear();
  TROUPE_ASSERT(plan.num_draft_tokens == 0 || (sampled_ids != nullptr && num_drafts != nullptr),
                "a plan with drafts needs its sampled ids and draft lengths");
  std::vector<TokenId> tokens_and_draft;
  std::vector<std::int32_t> scoring_rows;  // flat-batch rows, appended after the sampled ones
  for (const ScheduledChunk& chunk : plan.chunks) {
    const Sequence* seq = scheduler.find(chunk.id);
    TROUPE_ASSERT(seq != nullptr, "a planned sequence is gone");
    const std::int32_t first = seq->num_computed_tokens;
    const auto num_draft = static_cast<std::int32_t>(chunk.draft.size());
    const std::int32_t first_row = step.num_tokens();
    if (chunk.runs_draft_model()) {
      TROUPE_ASSERT(drafts != nullptr, "a plan with draft-model work needs its drafts");
      drafts->push_back({step.num_seqs(), chunk.draft_from,
                         std::vector<TokenId>(seq->tokens.begin() + chunk.draft_from,
                                              seq->tokens.begin() + chunk.draft_to),
                         num_draft, chunk.id});
    }
    if (num_draft == 0) {
      const std::span<const TokenId> tokens(seq->tokens.data() + first,
                                            static_cast<std::size_t>(chunk.num_new_tokens));
      model::append_sequence(step, tokens, first, seq->block_table, chunk.samples, seq->adapter);
    } else {
      // The sequence's last token, then the draft: logits at every one of them.
      tokens_and_draft.assign(seq->tokens.begin() + first, seq->tokens.end());
      tokens_and_draft.insert(tokens_and_draft.end(), chunk.draft.begin(), chunk.draft.end());
      TROUPE_ASSERT(static_cast<std::int32_t>(tokens_and_draft.size()) == chunk.num_new_tokens,
                    "a draft's chunk is the last token and the draft");
      model::append_sequence(step, tokens_and_draft, first, seq->block_table, false, seq->adapter);
      for (std::int32_t r = step.num_tokens() - 1 - num_draft; r < step.num_tokens(); ++r) {
        step.logit_rows.push_back(r);
      }
    }
    if (chunk.samples && sampled_ids != nullptr) sampled_ids->push_back(chunk.id);
    if (chunk.samples && num_drafts != nullptr && plan.num_draft_tokens > 0) {
      num_drafts->push_back(num_draft);
    }
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
