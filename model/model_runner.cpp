#include "model/model_runner.hpp"

#include <string>

namespace troupe::model {

Result<void> ModelRunner::add_sequence(std::uint64_t id, const SamplingParams& params,
                                       std::span<const TokenId> prompt) {
  TROUPE_TRY(auto sampler,
             Sampler::create(params, prompt, end_of_generation_, model_.config().vocab_size));
  samplers_.insert_or_assign(id, std::move(sampler));
  return {};
}

Result<std::vector<StepResult>> ModelRunner::execute(const StepInput& step,
                                                     std::span<const std::uint64_t> sampled_ids) {
  if (sampled_ids.size() != step.logit_rows.size()) {
    return make_error(ErrorCode::invalid_argument, "one sequence id per logit row is needed");
  }
  TROUPE_TRY_VOID(model_.forward(step, logits_));
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  std::vector<StepResult> results;
  results.reserve(sampled_ids.size());
  for (std::size_t row = 0; row < sampled_ids.size(); ++row) {
    const auto it = samplers_.find(sampled_ids[row]);
    if (it == samplers_.end()) {
      return make_error(ErrorCode::invalid_argument,
                        "no sampler for sequence " + std::to_string(sampled_ids[row]));
    }
    StepResult r;
    r.sampled = it->second.sample(std::span<const float>(logits_.data() + row * vocab, vocab));
    r.finish_reason = it->second.finish_reason();
    results.push_back(std::move(r));
  }
  return results;
}

}  // namespace troupe::model
