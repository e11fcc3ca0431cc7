// Flattens a batch plan into the model's step input: every chunk's tokens one
// after another, with positions, query offsets, context lengths, block tables
// and the rows whose logits are sampled, then the rows that score prompts.
#pragma once

#include <vector>

#include "engine/scheduler.hpp"
#include "model/draft_proposer.hpp"
#include "model/prompt_logprobs.hpp"
#include "model/step_input.hpp"

namespace troupe::engine {

// Call between schedule() and update(). `sampled_ids` receives, per sampled logit row,
// the sequence it samples for. With `prompt_rows`, a chunk of a sequence that scores its
// prompt (Sequence::scores_prompt) also asks logits for each of its rows whose next
// token is a prompt token: those rows follow the sampled ones in logit_rows, in the
// order of `prompt_rows`. (Its last prompt row is the sampled one, as for any chunk.)
// A decode with a draft runs its last token then the draft's, and asks logits for each
// of those rows, consecutively: `num_drafts` receives, per sampled sequence, its draft's
// length (the worker verifies the draft against them); it stays empty when the plan
// has no draft. A plan with drafts needs both `sampled_ids` and `num_drafts`.
// With a draft model, a draft's tokens are placeholders, and `drafts` receives what the
// worker's draft model runs for each chunk with a draft range (ScheduledChunk::draft_from):
// a plan with any needs it.
model::StepInput build_step_input(const BatchPlan& plan, const Scheduler& scheduler,
                                  std::vector<SeqId>* sampled_ids = nullptr,
                                  std::vector<model::PromptRows>* prompt_rows = nullptr,
                                  std::vector<std::int32_t>* num_drafts = nullptr,
                                  std::vector<model::DraftWork>* drafts = nullptr);

}  // namespace troupe::engine
