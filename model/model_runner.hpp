// Executes steps on one model: the forward pass, then one token sampled for each
// sequence that asked for logits, with each sequence's own sampler (its seed,
// penalties and min_tokens) kept from step to step.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/llama_model.hpp"
#include "model/sampler.hpp"

namespace troupe::model {

class ModelRunner {
 public:
  // Sees each sampled row's logits (for tests that compare them): (sequence, logits).
  using LogitsObserver = std::function<void(std::uint64_t, std::span<const float>)>;

  ModelRunner(LlamaModel& model, std::vector<TokenId> end_of_generation)
      : model_(model), end_of_generation_(std::move(end_of_generation)) {}

  // Starts sampling state for a sequence (the prompt feeds the repetition penalty).
  Result<void> add_sequence(std::uint64_t id, const SamplingParams& params,
                            std::span<const TokenId> prompt);
  void remove_sequence(std::uint64_t id) { samplers_.erase(id); }

  // Runs `step`; logit row i samples for sequence sampled_ids[i].
  Result<std::vector<SampledToken>> execute(const StepInput& step,
                                            std::span<const std::uint64_t> sampled_ids);

  // With an observer, every row is sampled on the host from logits read back.
  void set_logits_observer(LogitsObserver observer) { observer_ = std::move(observer); }

 private:
  LlamaModel& model_;
  std::vector<TokenId> end_of_generation_;
  std::unordered_map<std::uint64_t, Sampler> samplers_;
  LogitsObserver observer_;
  std::vector<float> logits_;
  std::vector<DeviceSamplingRow> device_rows_;
  std::vector<TokenId> ids_;
};

}  // namespace troupe::model
