// Speculative decoding's draft model: a second, cheaper model with the target's
// vocabulary proposes each speculating sequence's next tokens, greedily, before the
// target's step verifies them. It keeps its own paged KV cache, addressed by the
// target's block tables (the same block ids, the same slots), so it needs no blocks of
// its own from the scheduler. It sees a sequence's tokens lazily: the engine says which
// of them it has not seen yet (after a prefill, a preemption or steps without proposals),
// and the first of its passes runs those before proposing.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/llama_model.hpp"
#include "model/sampler.hpp"
#include "model/step_input.hpp"
#include "troupe/result.hpp"

namespace troupe::model {

// What the draft model runs for one sequence of a step.
struct DraftWork {
  std::int32_t seq = 0;             // the sequence's index in the target's step (its blocks)
  std::int32_t first_position = 0;  // the position of tokens[0]: the first it has not seen
  // The sequence's tokens from there: up to its last token when it proposes, or the first
  // part of those it has not seen (catching up only).
  std::vector<TokenId> tokens;
  // Tokens to propose after them; 0: it only catches up. A sequence that proposes k tokens
  // has the chunk [last token, k placeholders] in the target's step.
  std::int32_t num_proposals = 0;
  std::uint64_t id = 0;  // the sequence's id (its sampler's, in the model's runner)

  bool operator==(const DraftWork&) const = default;
};

class DraftProposer {
 public:
  explicit DraftProposer(LlamaModel& model) : model_(model) {}

  // Runs `work` on the draft model, sharing `step`'s block tables, and writes each
  // proposing sequence's tokens into its placeholders in `step`: k proposals take k
  // passes, the first of them also running every sequence's unseen tokens. Each proposal
  // is the draft's most likely token (the lowest id among equals), or, for a work item
  // with a guide (`guides`, one per item, or empty: none), the most likely its grammar
  // allows. An error where the work does not match the step.
  Result<void> propose(std::span<const DraftWork> work, StepInput& step,
                       std::span<std::optional<ProposalGuide>> guides = {});

 private:
  // The id of the largest of `logits` (the first such).
  static TokenId argmax(std::span<const float> logits);

  LlamaModel& model_;
  std::vector<float> logits_;
};

}  // namespace troupe::model
