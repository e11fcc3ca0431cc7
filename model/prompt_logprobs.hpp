// Prompt log-probabilities (SamplingParams::prompt_logprobs): which rows of a step score
// a prompt's next tokens, and what comes back of each row. Only the token's
// log-probability, its rank and the n most likely leave the runner, never a row of the
// vocabulary's size.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/sampler.hpp"
#include "troupe/types.hpp"

namespace troupe::model {

// One sequence's rows of a step that score its prompt. They follow the step's sampled
// rows in StepInput::logit_rows, sequence after sequence, one row per target.
struct PromptRows {
  std::uint64_t id = 0;
  std::int32_t first_position = 0;  // of the first row; its target is the token after it
  std::int32_t top_n = 0;           // the most likely tokens to keep at each row
  std::vector<TokenId> targets;     // the prompt token after each row's

  bool operator==(const PromptRows&) const = default;
};

// One sequence's scores from one step: entries[i] scores the prompt token at position
// first_position + 1 + i.
struct PromptLogprobs {
  std::uint64_t id = 0;
  std::int32_t first_position = 0;
  std::vector<PromptLogprob> entries;

  bool operator==(const PromptLogprobs&) const = default;
};

// Scores `target` under one row of logits: its log-softmax computed as the sampler
// computes a sampled token's (so teacher forcing gives the same number), its rank, and
// the `top_n` most likely (ties: lowest id first).
PromptLogprob score_prompt_token(std::span<const float> logits, TokenId target, std::int32_t top_n);

}  // namespace troupe::model
