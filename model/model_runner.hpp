// Executes the engine's steps on one model: the forward pass, then one token
// sampled for each sequence that asked for logits, with each sequence's own
// sampler (its seed, penalties and stop rules) kept from step to step.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/llama_model.hpp"
#include "model/sampler.hpp"

namespace troupe::model {

struct StepResult {
  SampledToken sampled;
  FinishReason finish_reason = FinishReason::none;  // the sampler's verdict after this token
};

class ModelRunner {
 public:
  ModelRunner(LlamaModel& model, std::vector<TokenId> end_of_generation)
      : model_(model), end_of_generation_(std::move(end_of_generation)) {}

  // Starts sampling state for a sequence (the prompt feeds the repetition penalty).
  Result<void> add_sequence(std::uint64_t id, const SamplingParams& params,
                            std::span<const TokenId> prompt);
  void remove_sequence(std::uint64_t id) { samplers_.erase(id); }
  std::size_t num_sequences() const { return samplers_.size(); }

  // Runs `step`; logit row i samples for sequence sampled_ids[i].
  Result<std::vector<StepResult>> execute(const StepInput& step,
                                          std::span<const std::uint64_t> sampled_ids);

  LlamaModel& model() { return model_; }

 private:
  LlamaModel& model_;
  std::vector<TokenId> end_of_generation_;
  std::unordered_map<std::uint64_t, Sampler> samplers_;
  std::vector<float> logits_;
  std::vector<DeviceSamplingRow> device_rows_;
  std::vector<TokenId> ids_;
};

}  // namespace troupe::model
