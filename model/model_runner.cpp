#include "model/model_runner.hpp"

#include <string>

namespace troupe::model {

Result<void> ModelRunner::add_sequence(std::uint64_t id, const SamplingParams& params,
                                       std::span<const TokenId> prompt) {
  if (!model_.shard().computes_logits()) return {};  // rank 0 samples for the group
  TROUPE_TRY(auto sampler,
             Sampler::create(params, prompt, end_of_generation_, model_.config().vocab_size));
  samplers_.insert_or_assign(id, std::move(sampler));
  return {};
}

Result<std::vector<SampledToken>> ModelRunner::execute(const StepInput& step,
                                                       std::span<const std::uint64_t> sampled_ids) {
  if (sampled_ids.size() != step.logit_rows.size()) {
    return make_error(ErrorCode::invalid_argument, "one sequence id per logit row is needed");
  }
  // A rank other than 0 of a tensor-parallel group runs its share of the step and
  // samples nothing: rank 0 holds the logits.
  if (!model_.shard().computes_logits()) {
    TROUPE_TRY_VOID(model_.forward(step, logits_));
    return std::vector<SampledToken>{};
  }
  std::vector<Sampler*> samplers;
  samplers.reserve(sampled_ids.size());
  for (const std::uint64_t id : sampled_ids) {
    const auto it = samplers_.find(id);
    if (it == samplers_.end()) {
      // The other ranks of a group run this step whatever: so does rank 0, and it fails.
      if (model_.shard().is_split()) TROUPE_TRY_VOID(model_.forward(step, logits_));
      return make_error(ErrorCode::invalid_argument,
                        "no sampler for sequence " + std::to_string(id));
    }
    samplers.push_back(&it->second);
  }
  std::vector<SampledToken> results;
  results.reserve(sampled_ids.size());
  // On a device that samples, only token ids come back, unless a row needs the host.
  if (model_.backend().can_sample() && !samplers.empty() && !observer_) {
    device_rows_.clear();
    for (const Sampler* sampler : samplers) {
      const auto row = sampler->device_row();
      if (!row) break;
      device_rows_.push_back(*row);
    }
    if (device_rows_.size() == samplers.size()) {
      TROUPE_TRY_VOID(model_.forward_sample(step, device_rows_, ids_));
      for (std::size_t row = 0; row < samplers.size(); ++row) {
        results.push_back(samplers[row]->accept(ids_[row]));
      }
      return results;
    }
  }
  TROUPE_TRY_VOID(model_.forward(step, logits_));
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  for (std::size_t row = 0; row < samplers.size(); ++row) {
    const std::span<const float> row_logits(logits_.data() + row * vocab, vocab);
    if (observer_) observer_(sampled_ids[row], row_logits);
    results.push_back(samplers[row]->sample(row_logits));
  }
  return results;
}

}  // namespace troupe::model
