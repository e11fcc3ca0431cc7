#include "engine/step_builder.hpp"

#include <span>

namespace troupe::engine {

model::StepInput build_step_input(const BatchPlan& plan, const Scheduler& scheduler,
                                  std::vector<SeqId>* sampled_ids) {
  model::StepInput step;
  if (sampled_ids != nullptr) sampled_ids->clear();
  for (const ScheduledChunk& chunk : plan.chunks) {
    const Sequence* seq = scheduler.find(chunk.id);
    TROUPE_ASSERT(seq != nullptr, "a planned sequence is gone");
    const std::span<const TokenId> tokens(seq->tokens.data() + seq->num_computed_tokens,
                                          static_cast<std::size_t>(chunk.num_new_tokens));
    model::append_sequence(step, tokens, seq->num_computed_tokens, seq->block_table, chunk.samples);
    if (chunk.samples && sampled_ids != nullptr) sampled_ids->push_back(chunk.id);
  }
  return step;
}

}  // namespace troupe::engine
