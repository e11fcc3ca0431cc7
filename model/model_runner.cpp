#include "model/model_runner.hpp"

#include <algorithm>
#include <future>
#include <string>
#include <system_error>
#include <thread>

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

void ModelRunner::start_masks(std::span<Sampler* const> samplers) {
  for (Sampler* sampler : samplers) {
    if (!sampler->constrained()) continue;
    if (!mask_workers_) mask_workers_ = std::make_unique<MaskWorkers>();
    sampler->start_mask(*mask_workers_);
  }
}

std::vector<Sampler::MaskState> ModelRunner::settle_masks(std::span<Sampler* const> samplers) {
  using State = Sampler::MaskState;
  std::vector<State> states(samplers.size(), State::ready);
  const auto deadline = MaskJob::Clock::now() + kMaskWait;
  while (true) {
    bool pending = false, ready = false;
    for (std::size_t row = 0; row < samplers.size(); ++row) {
      states[row] = samplers[row]->mask_state();
      pending = pending || states[row] == State::pending;
      ready = ready || states[row] == State::ready;
    }
    // A row that can sample goes now: the late ones skip this step (their masks go on).
    if (!pending || ready || MaskJob::Clock::now() >= deadline) return states;
    // No row could sample at all: waiting delays no one's token, for a while.
    for (std::size_t row = 0; row < samplers.size(); ++row) {
      if (states[row] != State::pending) continue;
      samplers[row]->wait_mask_until(
          std::min(deadline, MaskJob::Clock::now() + std::chrono::milliseconds(1)));
      break;
    }
  }
}

SampledToken ModelRunner::no_token(const Sampler& sampler, Sampler::MaskState state) {
  SampledToken token;
  if (state == Sampler::MaskState::failed) token.error = sampler.failure();
  return token;
}

Result<void> ModelRunner::add_sequence(std::uint64_t id, const SamplingParams& params,
                                       std::span<const TokenId> prompt,
                                       std::span<const TokenId> generated) {
  // Rank 0 (of the last pipeline stage) samples for the group.
  if (!model_.shard().computes_logits()) return {};
  OutputGrammar constraint;
  if (!params.grammar.empty()) {
    TROUPE_TRY(constraint, output_grammar(params.grammar));
  }
  TROUPE_TRY(auto sampler, Sampler::create(params, prompt, end_of_generation_,
                                           model_.config().vocab_size, std::move(constraint)));
  TROUPE_TRY_VOID(sampler.resume(generated));
  samplers_.insert_or_assign(id, std::move(sampler));
  return {};
}

void ModelRunner::score_prompt_rows(std::span<const PromptRows> prompt_rows, std::size_t first_row,
                                    std::vector<PromptLogprobs>* out) {
  if (out == nullptr || prompt_rows.empty()) return;
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  // Every row's place in the logits and in the answer, then the rows scored on a few
  // threads: each is a pass of exp over the vocabulary, and a long prompt has a row per
  // token. A row's numbers never depend on the others', nor on the thread.
  struct Job {
    const float* logits;
    TokenId target;
    std::int32_t top_n;
    PromptLogprob* entry;
  };
  std::vector<Job> jobs;
  out->clear();
  out->reserve(prompt_rows.size());
  std::size_t row = first_row;
  for (const PromptRows& rows : prompt_rows) {
    out->push_back({rows.id, rows.first_position, {}});
    out->back().entries.resize(rows.targets.size());
  }
  for (std::size_t r = 0; r < prompt_rows.size(); ++r) {
    for (std::size_t i = 0; i < prompt_rows[r].targets.size(); ++i) {
      jobs.push_back({logits_.data() + row++ * vocab, prompt_rows[r].targets[i],
                      prompt_rows[r].top_n, &(*out)[r].entries[i]});
    }
  }
  auto run = [&jobs, vocab](std::size_t begin, std::size_t end) {
    for (std::size_t j = begin; j < end; ++j) {
      *jobs[j].entry = score_prompt_token({jobs[j].logits, vocab}, jobs[j].target, jobs[j].top_n);
    }
  };
  constexpr std::size_t kRowsPerThread = 16;
  const std::size_t threads = std::clamp<std::size_t>(
      std::min<std::size_t>(std::thread::hardware_concurrency(), kMaxScoringThreads), 1,
      std::max<std::size_t>(jobs.size() / kRowsPerThread, 1));
  std::vector<std::future<void>> parts;
  const std::size_t per = (jobs.size() + threads - 1) / threads;
  std::size_t begin = per;  // [0, per) is this thread's
  try {
    for (; begin < jobs.size(); begin += per) {
      parts.push_back(
          std::async(std::launch::async, run, begin, std::min(begin + per, jobs.size())));
    }
  } catch (const std::system_error&) {
    run(begin, jobs.size());  // no thread to be had: the rest here
  }
  run(0, std::min(per, jobs.size()));
  for (auto& part : parts) part.get();
}

Result<std::vector<SampledToken>> ModelRunner::execute(
    const StepInput& step, std::span<const std::uint64_t> sampled_ids,
    std::span<const PromptRows> prompt_rows, std::vector<PromptLogprobs>* prompt_scores,
    std::span<const std::int32_t> num_drafts, std::vector<std::vector<SampledToken>>* more) {
  if (prompt_scores != nullptr) prompt_scores->clear();
  if (more != nullptr) more->clear();
  if (!num_drafts.empty() && num_drafts.size() != sampled_ids.size()) {
    return make_error(ErrorCode::invalid_argument, "one draft length per sampled row is needed");
  }
  std::size_t num_draft_rows = 0;
  for (const std::int32_t n : num_drafts) {
    if (n < 0) return make_error(ErrorCode::invalid_argument, "a draft length is negative");
    num_draft_rows += static_cast<std::size_t>(n);
  }
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
  if (sampled_ids.size() + num_draft_rows + num_prompt_rows != step.logit_rows.size()) {
    return make_error(ErrorCode::invalid_argument,
                      "one sequence id per sampled row, one row per draft token and one target "
                      "per prompt row are needed");
  }
  if (num_draft_rows > 0 && more == nullptr) {
    return make_error(ErrorCode::invalid_argument,
                      "a step with drafts needs room for their tokens");
  }
  // A rank other than 0 of a tensor-parallel group, or a pipeline stage but the last, runs
  // its share of the step and samples nothing: rank 0 of the last stage holds the logits.
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
      if (model_.shard().is_split() || model_.shard().is_staged()) {
        TROUPE_TRY_VOID(model_.forward(step, logits_));
      }
      return make_error(ErrorCode::invalid_argument,
                        "no sampler for sequence " + std::to_string(id));
    }
    samplers.push_back(&it->second);
  }
  std::vector<SampledToken> results;
  results.reserve(sampled_ids.size());
  // On a device that samples, only token ids come back, unless a row needs the host.
  if (model_.backend().can_sample() && !samplers.empty() && !observer_ && num_prompt_rows == 0 &&
      num_draft_rows == 0) {
    device_rows_.clear();
    for (const Sampler* sampler : samplers) {
      const auto row = sampler->device_row();
      if (!row) break;
      device_rows_.push_back(*row);
    }
    if (device_rows_.size() == samplers.size()) {
      // The grammars' bitmasks are made while the device runs the forward pass; a row
      // without its mask in time is drawn unmasked, and its draw dropped.
      start_masks(samplers);
      std::vector<Sampler::MaskState> states;
      TROUPE_TRY_VOID(model_.forward_sample(step, device_rows_, ids_, [&] {
        states = settle_masks(samplers);
        for (std::size_t row = 0; row < samplers.size(); ++row) {
          if (states[row] == Sampler::MaskState::ready) {
            samplers[row]->prepare_device_mask();
          } else {
            device_rows_[row].allowed = nullptr;
          }
        }
      }));
      for (std::size_t row = 0; row < samplers.size(); ++row) {
        results.push_back(states[row] == Sampler::MaskState::ready
                              ? samplers[row]->accept(ids_[row])
                              : no_token(*samplers[row], states[row]));
      }
      return results;
    }
  }
  start_masks(samplers);
  TROUPE_TRY_VOID(model_.forward(step, logits_));
  const std::vector<Sampler::MaskState> states = settle_masks(samplers);
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  if (more != nullptr) more->resize(samplers.size());
  std::size_t row = 0;  // logit row
  for (std::size_t i = 0; i < samplers.size(); ++i) {
    const std::size_t num_draft = num_drafts.empty() ? 0 : static_cast<std::size_t>(num_drafts[i]);
    const std::size_t first = row;
    row += 1 + num_draft;
    const std::span<const float> row_logits(logits_.data() + first * vocab, vocab);
    if (observer_) observer_(sampled_ids[i], row_logits);
    results.push_back(states[i] == Sampler::MaskState::ready ? samplers[i]->sample(row_logits)
                                                             : no_token(*samplers[i], states[i]));
    if (results.back().id == kNoToken) continue;
    // Verification: row first + j holds the j-th proposed token, and its logits give the
    // token after it. While the model's token is the proposal, the next row counts. Under a
    // grammar each row is drawn under its own mask, made here, so a proposal the grammar
    // refuses is never the model's token: the draft ends there.
    TokenId last = results.back().id;
    for (std::size_t j = 1; j <= num_draft; ++j) {
      const auto flat = static_cast<std::size_t>(step.logit_rows[first + j]);
      if (last != step.tokens[flat]) break;
      // A mask that cannot be made (the grammar's work budget) fails at the next step's
      // first position, as without a draft.
      if (samplers[i]->compute_mask() != Sampler::MaskState::ready) break;
      const std::span<const float> next(logits_.data() + (first + j) * vocab, vocab);
      if (observer_) observer_(sampled_ids[i], next);
      (*more)[i].push_back(samplers[i]->sample(next));
      last = (*more)[i].back().id;
    }
  }
  score_prompt_rows(prompt_rows, row, prompt_scores);
  return results;
}

}  // namespace troupe::model
