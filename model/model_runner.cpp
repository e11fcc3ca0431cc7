#include "model/model_runner.hpp"

#include <future>
#include <string>

#include "grammar/gbnf.hpp"

namespace troupe::model {

Result<OutputGrammar> ModelRunner::output_grammar(const std::string& gbnf) {
  if (tokenizer_ == nullptr) {
    return make_error(ErrorCode::invalid_argument,
                      "this runner has no tokenizer: it cannot hold outputs to a grammar");
  }
  if (!masker_) {
    // Each token's bytes, once per model; ids past the tokenizer's (a padded embedding)
    // stand for nothing.
    std::vector<std::string> bytes(static_cast<std::size_t>(model_.config().vocab_size));
    const auto known = std::min(bytes.size(), tokenizer_->size());
    for (std::size_t id = 0; id < known; ++id) {
      bytes[id] = std::string(tokenizer_->piece(static_cast<TokenId>(id)));
    }
    masker_ = std::make_shared<const grammar::TokenMasker>(std::move(bytes));
  }
  if (const auto it = grammars_.find(gbnf); it != grammars_.end()) {
    return OutputGrammar{it->second, masker_};
  }
  auto refused = [](const Error& error) {
    return make_error(ErrorCode::invalid_argument,
                      "the output's grammar does not compile: " + error.message);
  };
  const auto parsed = grammar::parse_gbnf(gbnf);
  if (!parsed) return refused(parsed.error());
  auto compiled = grammar::compile(*parsed);
  if (!compiled) return refused(compiled.error());
  if (grammars_.size() >= kMaxCachedGrammars) grammars_.clear();
  auto shared = std::make_shared<const grammar::CompiledGrammar>(std::move(*compiled));
  grammars_.emplace(gbnf, shared);
  return OutputGrammar{std::move(shared), masker_};
}

std::future<void> ModelRunner::start_masks(std::span<Sampler* const> samplers, bool device) {
  // A grammar's mask depends only on the tokens so far: it is computed on another thread
  // while the forward pass runs. Nothing to start without a constrained row.
  std::vector<Sampler*> constrained;
  for (Sampler* sampler : samplers) {
    if (sampler->constrained()) constrained.push_back(sampler);
  }
  if (constrained.empty()) return {};
  return std::async(std::launch::async, [constrained = std::move(constrained), device] {
    for (Sampler* sampler : constrained) {
      if (device) {
        sampler->prepare_device_mask();
      } else {
        sampler->prepare_mask();
      }
    }
  });
}

Result<void> ModelRunner::add_sequence(std::uint64_t id, const SamplingParams& params,
                                       std::span<const TokenId> prompt) {
  if (!model_.shard().computes_logits()) return {};  // rank 0 samples for the group
  OutputGrammar constraint;
  if (!params.grammar.empty()) {
    TROUPE_TRY(constraint, output_grammar(params.grammar));
  }
  TROUPE_TRY(auto sampler, Sampler::create(params, prompt, end_of_generation_,
                                           model_.config().vocab_size, std::move(constraint)));
  samplers_.insert_or_assign(id, std::move(sampler));
  return {};
}

Result<std::vector<SampledToken>> ModelRunner::execute(const StepInput& step,
                                                       std::span<const std::uint64_t> sampled_ids,
                                                       std::span<const PromptRows> prompt_rows,
                                                       std::vector<PromptLogprobs>* prompt_scores) {
  if (prompt_scores != nullptr) prompt_scores->clear();
  std::size_t num_prompt_rows = 0;
  for (const PromptRows& rows : prompt_rows) {
    for (const TokenId t : rows.targets) {
      if (t < 0 || t >= model_.config().vocab_size) {
        return make_error(ErrorCode::invalid_argument,
                          "a prompt token to score is outside the vocabulary");
      }
    }
    num_prompt_rows += rows.targets.size();
  }
  if (sampled_ids.size() + num_prompt_rows != step.logit_rows.size()) {
    return make_error(ErrorCode::invalid_argument,
                      "one sequence id per sampled row and one target per prompt row are needed");
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
  if (model_.backend().can_sample() && !samplers.empty() && !observer_ && num_prompt_rows == 0) {
    device_rows_.clear();
    for (const Sampler* sampler : samplers) {
      const auto row = sampler->device_row();
      if (!row) break;
      device_rows_.push_back(*row);
    }
    if (device_rows_.size() == samplers.size()) {
      // The grammars' bitmasks are made while the device runs the forward pass.
      std::future<void> masks = start_masks(samplers, /*device=*/true);
      TROUPE_TRY_VOID(model_.forward_sample(step, device_rows_, ids_, [&masks] {
        if (masks.valid()) masks.get();
      }));
      for (std::size_t row = 0; row < samplers.size(); ++row) {
        results.push_back(samplers[row]->accept(ids_[row]));
      }
      return results;
    }
  }
  std::future<void> masks = start_masks(samplers, /*device=*/false);
  auto forward = model_.forward(step, logits_);
  if (masks.valid()) masks.get();
  TROUPE_TRY_VOID(std::move(forward));
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  for (std::size_t row = 0; row < samplers.size(); ++row) {
    const std::span<const float> row_logits(logits_.data() + row * vocab, vocab);
    if (observer_) observer_(sampled_ids[row], row_logits);
    results.push_back(samplers[row]->sample(row_logits));
  }
  // The prompt rows: each scored, then forgotten (the buffer is the next step's).
  std::size_t row = samplers.size();
  for (const PromptRows& rows : prompt_rows) {
    PromptLogprobs scores{rows.id, rows.first_position, {}};
    scores.entries.reserve(rows.targets.size());
    for (const TokenId target : rows.targets) {
      const std::span<const float> row_logits(logits_.data() + row * vocab, vocab);
      scores.entries.push_back(score_prompt_token(row_logits, target, rows.top_n));
      ++row;
    }
    if (prompt_scores != nullptr) prompt_scores->push_back(std::move(scores));
  }
  return results;
}

}  // namespace troupe::model
