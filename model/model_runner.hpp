// Executes steps on one model: the forward pass, then one token sampled for each
// sequence that asked for logits, with each sequence's own sampler (its seed,
// penalties, min_tokens and grammar) kept from step to step. The grammars' token masks
// are computed in the background (MaskWorkers) while the forward pass runs; a row whose
// mask is late gets no token this step rather than hold the others up.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/token_masker.hpp"
#include "model/llama_model.hpp"
#include "model/prompt_logprobs.hpp"
#include "model/sampler.hpp"
#include "text/tokenizer.hpp"

namespace troupe::model {

class ModelRunner {
 public:
  // Sees each sampled row's logits (for tests that compare them): (sequence, logits).
  using LogitsObserver = std::function<void(std::uint64_t, std::span<const float>)>;

  // `tokenizer` (which must outlive the runner) gives the tokens' bytes for grammars;
  // without it, a sequence with a grammar is refused.
  ModelRunner(LlamaModel& model, std::vector<TokenId> end_of_generation,
              const text::Tokenizer* tokenizer = nullptr)
      : model_(model), end_of_generation_(std::move(end_of_generation)), tokenizer_(tokenizer) {}

  // Starts sampling state for a sequence (the prompt feeds the repetition penalty), after
  // the tokens it `generated` before (a resumed sequence: Sampler::resume). A grammar
  // (params.grammar) that does not compile is an invalid_argument error.
  Result<void> add_sequence(std::uint64_t id, const SamplingParams& params,
                            std::span<const TokenId> prompt,
                            std::span<const TokenId> generated = {});

  // Compiled grammars kept, by their text, so that requests with the same schema share
  // them and their cached masks; past this many the cache starts over.
  static constexpr std::size_t kMaxCachedGrammars = 64;
  void remove_sequence(std::uint64_t id) { samplers_.erase(id); }
  // A guide for sequence `id`'s draft proposals, where its output is held to a grammar
  // (Sampler::proposal_guide); none otherwise, or for a sequence it does not know.
  std::optional<ProposalGuide> proposal_guide(std::uint64_t id) const {
    const auto it = samplers_.find(id);
    return it == samplers_.end() ? std::nullopt : it->second.proposal_guide();
  }

  // Runs `step`; logit row i samples for sequence sampled_ids[i]. The logit rows after
  // those score prompts (`prompt_rows`, in order, one row per target); their scores go to
  // `prompt_scores`, one PromptLogprobs per PromptRows. A step that scores a prompt is
  // sampled on the host: its logits are read back anyway. A constrained row whose mask is
  // not ready when the forward pass ends gets kNoToken (its position must run again), and
  // one whose grammar ran out of its work budget kNoToken with the error
  // (SampledToken::error); the step waits past the forward pass for masks only while no
  // row at all could sample, and then at most kMaskWait.
  //
  // Speculative decoding: with `num_drafts` (one per sampled id, or empty), sequence i's
  // sampled row is followed by num_drafts[i] more logit rows, the rows of its proposed
  // tokens. Its sampler takes the first row's token, then, while that token is the one
  // the next row holds (the proposal was right), the next row's token: the tokens after
  // the first go to (*more)[i]. Each is sampled exactly as a plain decode samples it
  // (penalties, seeded draws, log-probabilities), so the output is the one without
  // proposals; at temperature > 0 this is exact rejection sampling for a proposer that
  // is sure of its token (q one-hot: a proposal t is accepted with probability p(t),
  // and a rejection draws from p without t). A constrained sequence verifies nothing past
  // its first row. Such a step samples on the host.
  Result<std::vector<SampledToken>> execute(const StepInput& step,
                                            std::span<const std::uint64_t> sampled_ids,
                                            std::span<const PromptRows> prompt_rows = {},
                                            std::vector<PromptLogprobs>* prompt_scores = nullptr,
                                            std::span<const std::int32_t> num_drafts = {},
                                            std::vector<std::vector<SampledToken>>* more = nullptr);

  // With an observer, every row is sampled on the host from logits read back.
  void set_logits_observer(LogitsObserver observer) { observer_ = std::move(observer); }

 private:
  Result<OutputGrammar> output_grammar(const std::string& gbnf);
  // Scores the prompt rows, which start at logit row `first_row` of logits_.
  void score_prompt_rows(std::span<const PromptRows> prompt_rows, std::size_t first_row,
                         std::vector<PromptLogprobs>* out);
  // Most threads that score a step's prompt rows (the forward pass's are idle then).
  static constexpr std::size_t kMaxScoringThreads = 8;
  // Starts the constrained samplers' masks on the mask workers.
  void start_masks(std::span<Sampler* const> samplers);
  // After the forward pass: each row's mask state, having waited as execute() says.
  static std::vector<Sampler::MaskState> settle_masks(std::span<Sampler* const> samplers);
  // The token a row that cannot sample this step gets.
  static SampledToken no_token(const Sampler& sampler, Sampler::MaskState state);

 public:
  static constexpr std::chrono::milliseconds kMaskWait{50};

 private:
  LlamaModel& model_;
  std::vector<TokenId> end_of_generation_;
  const text::Tokenizer* tokenizer_ = nullptr;
  std::shared_ptr<const grammar::TokenMasker> masker_;  // built at the first grammar
  std::unordered_map<std::string, std::shared_ptr<const grammar::CompiledGrammar>> grammars_;
  std::unordered_map<std::uint64_t, Sampler> samplers_;
  LogitsObserver observer_;
  std::vector<float> logits_;
  std::vector<DeviceSamplingRow> device_rows_;
  std::vector<TokenId> ids_;
  std::unique_ptr<MaskWorkers> mask_workers_;  // made at the first constrained step
};

}  // namespace troupe::model
