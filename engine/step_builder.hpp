// Flattens a batch plan into the model's step input: every chunk's tokens one
// after another, with positions, query offsets, context lengths, block tables
// and the rows whose logits are sampled.
#pragma once

#include <vector>

#include "engine/scheduler.hpp"
#include "model/step_input.hpp"

namespace troupe::engine {

// Call between schedule() and update(). `sampled_ids` receives, per logit row,
// the sequence it samples for.
model::StepInput build_step_input(const BatchPlan& plan, const Scheduler& scheduler,
                                  std::vector<SeqId>* sampled_ids = nullptr);

}  // namespace troupe::engine
