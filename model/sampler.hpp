// Chooses a sequence's next token from its logits: penalties, temperature,
// top-k / top-p / min-p, seeded draws keyed by the token's position (sampling_draw in
// model/splitmix64.hpp, the device's too), log-probabilities,
// min_tokens (end-of-generation and stop ids masked until then), and a grammar's
// token mask for structured outputs (grammar/). Whether a sequence has ended is not the
// sampler's to say: stop and end-of-generation ids and lengths are the engine's
// (engine/stop_rule.hpp), stop strings and deadlines the request actor's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grammar/matcher.hpp"
#include "grammar/token_masker.hpp"
#include "model/mask_workers.hpp"
#include "troupe/logprobs.hpp"
#include "troupe/result.hpp"
#include "troupe/sampling.hpp"

namespace troupe::model {

struct SampledToken {
  // kNoToken: the row has no token this step. Its grammar's mask was not ready when the
  // step's forward pass ended (the engine runs its position again in the next step), or,
  // with `error`, its sequence cannot go on.
  TokenId id = kNoToken;
  float logprob = 0.0f;                    // of the chosen token, under the model's distribution
  std::vector<TokenLogprob> top_logprobs;  // the n most likely, when asked
  std::string error = {};                  // why the sequence must end (id is kNoToken)

  bool operator==(const SampledToken&) const = default;
};

// One row's parameters for sampling on the device (no penalties, no log-probabilities).
struct DeviceSamplingRow {
  float temperature = 1.0f;  // 0: greedy
  std::int32_t top_k = 0;    // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  std::uint64_t seed = 0;     // the sequence's sampling_key: with `counter`, the row's draw
  std::uint64_t counter = 0;  // tokens the sequence has generated so far (its position)
  // A grammar's allowed tokens (bit t % 64 of word t / 64, [(vocab + 63) / 64] words, the
  // end tokens included where they may come): every other logit is -inf. Null: all. It is
  // the sampler's, filled by prepare_device_mask() before the draw.
  const std::uint64_t* allowed = nullptr;
};

// The grammar an output is held to (SamplingParams::grammar, compiled) and the model's
// token masker; both null for a free output.
struct OutputGrammar {
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  std::shared_ptr<const grammar::TokenMasker> masker;
};

// Guides a draft model's proposals for an output held to a grammar: from the grammar's
// state after the output so far, each proposal is the likeliest token the grammar allows
// next (as the verification's mask will), so a draft is not wasted on a token the model's
// masked draw can never be. It never proposes an end token. Where the grammar cannot be
// followed (its work budget), it stops guiding and the proposal is the likeliest of all.
class ProposalGuide {
 public:
  ProposalGuide(grammar::Matcher state, std::string taken,
                std::shared_ptr<const grammar::TokenMasker> masker, std::vector<TokenId> ends)
      : state_(std::move(state)),
        taken_(std::move(taken)),
        masker_(std::move(masker)),
        ends_(std::move(ends)) {}

  // The proposal from one row of the draft's logits [vocab]; the guide then stands after it.
  TokenId choose(std::span<const float> logits);

 private:
  grammar::Matcher state_;
  std::string taken_;  // bytes state_ has not been advanced by
  std::shared_ptr<const grammar::TokenMasker> masker_;
  std::vector<TokenId> ends_;
  bool guiding_ = true;
};

class Sampler {
 public:
  // Checks the parameters; `end_of_generation` are the vocabulary's EOS-like ids. With
  // `constraint`, every token is masked first to those the grammar allows next; the end
  // tokens (EOS-like and stop ids) are allowed exactly where the grammar can end, and the
  // only choice once it must (min_tokens then yields to the grammar).
  static Result<Sampler> create(const SamplingParams& params, std::span<const TokenId> prompt,
                                std::vector<TokenId> end_of_generation, std::int32_t vocab_size,
                                OutputGrammar constraint = {});

  // Picks the next token from one row of logits [vocab_size]; records it.
  SampledToken sample(std::span<const float> logits);

  // The next draw as a device can make it, or nothing when it needs the host: penalties,
  // log-probabilities, or stop tokens still masked by min_tokens (a grammar's row masks
  // them in its bitmask instead).
  std::optional<DeviceSamplingRow> device_row() const;
  // Fills the bitmask device_row().allowed points at: the grammar's mask with the end
  // tokens where they may come. A runner calls it (on any thread) before the draw.
  void prepare_device_mask();
  // Records a token chosen elsewhere (on the device) from device_row()'s parameters.
  SampledToken accept(TokenId id);
  // Records tokens already generated (sent to the client) by an earlier run of the same
  // sequence, as if this sampler had drawn them: the output counts for the penalties,
  // min_tokens, the grammar (advanced over their bytes with the next mask) and the draws'
  // position move on, so the tokens drawn next are those the earlier run would have drawn.
  // Each id must be in the vocabulary.
  Result<void> resume(std::span<const TokenId> generated);

  // For tests: the tokens a draw (temperature > 0) chooses among, from these logits as
  // given (no penalties or grammar mask applied: pass logits that already carry them),
  // most likely first when a filter is on; the rules the device's sampler is held to
  // (tests/gpu/sampling_rules_test.cpp).
  std::vector<TokenId> kept_tokens(std::span<const float> logits);

  std::int32_t num_generated() const { return static_cast<std::int32_t>(output_.size()); }
  const std::vector<TokenId>& output() const { return output_; }

  // Held to its grammar now: a grammar that starts after SamplingParams::grammar_after
  // holds only once the output has written those tokens (before, the output is free).
  bool constrained() const { return matcher_.has_value() && grammar_started_; }

  // Where the grammar's mask for the next position stands. ready: sample() may run (always,
  // for a free output); pending: a job computes it still; failed: the grammar cannot be
  // followed within its work budget, failure() says where.
  enum class MaskState { ready, pending, failed };
  // Starts the next position's mask on `workers`, unless it is ready or under way (a
  // runner calls it before the forward pass). Nothing for a free output.
  void start_mask(MaskWorkers& workers);
  MaskState mask_state();
  // Waits for a mask under way until `deadline`; whether it is no longer pending.
  bool wait_mask_until(MaskJob::Clock::time_point deadline);
  const std::string& failure() const { return failure_; }
  // Computes the next position's mask here, if it is not ready (waiting for a job under
  // way): sample() calls it; so may a runner without workers.
  void prepare_mask();
  // Computes the next position's mask here, as a job would, and says where it stands: what
  // a runner verifying a draft asks past a step's first position, where no job ran. Unlike
  // prepare_mask, a grammar that cannot be followed is `failed` here (as a job's failure:
  // no token), not a mask of end tokens.
  MaskState compute_mask();
  // Whether a sampled token fell outside what the grammar could take (the mask and the
  // matcher disagreed, or a limit of the matcher was passed): only end tokens follow. Known
  // once the next mask's work has run (the matcher advances with it, off the step).
  bool grammar_broken() const { return grammar_broken_; }
  // A guide for a draft's proposals after the output so far: none for a free output (or a
  // grammar not started yet, broken, failed, or with its next mask under way).
  std::optional<ProposalGuide> proposal_guide() const;

 private:
  Sampler() = default;
  void apply_penalties(std::vector<float>& logits) const;
  void apply_grammar(std::vector<float>& logits);
  // Whether an end token may come now: where nothing else may, or where the grammar can
  // end once min_tokens are out. `other`: a token that continues the output is allowed.
  bool ends_allowed(bool other) const;
  TokenId choose(std::span<const float> logits);
  // Fills candidates_ and probs_ with the tokens top-k, min-p and top-p keep (sorted when a
  // filter is on) and `total` with their mass; returns how many.
  std::size_t keep_candidates(std::span<const float> logits, double& total);
  void record(TokenId id);
  // A finished job's outcome: the advanced matcher and its mask, a broken grammar, or a
  // failure.
  void take(MaskJob& job);

  SamplingParams params_;
  std::int32_t vocab_size_ = 0;
  std::vector<TokenId> end_of_generation_;
  std::unordered_map<TokenId, std::int32_t> prompt_counts_;
  std::unordered_map<TokenId, std::int32_t> output_counts_;
  std::vector<TokenId> output_;
  std::uint64_t draw_key_ = 0;  // sampling_key of the seed: the host's and the device's draws
  std::vector<float> scratch_;
  std::vector<std::pair<float, TokenId>> candidates_;
  std::vector<double> probs_;
  // A constrained output's place in its grammar and the mask for its next token.
  std::optional<grammar::Matcher> matcher_;
  std::shared_ptr<const grammar::TokenMasker> masker_;
  std::vector<std::uint64_t> mask_;
  std::vector<std::uint64_t> device_mask_;  // sized once: device rows point into it
  bool mask_ready_ = false;
  bool grammar_broken_ = false;
  bool grammar_started_ = true;  // false until the output wrote SamplingParams::grammar_after
  // The next mask's job while it runs: cancelled when replaced, or when the sampler goes.
  struct JobHandle {
    std::shared_ptr<MaskJob> job;
    JobHandle() = default;
    JobHandle(JobHandle&& other) noexcept : job(std::move(other.job)) {}
    JobHandle& operator=(JobHandle&& other) noexcept {
      if (this != &other) {
        if (job) job->cancel();
        job = std::move(other.job);
      }
      return *this;
    }
    ~JobHandle() {
      if (job) job->cancel();
    }
  };
  JobHandle job_;
  std::string taken_;                 // bytes of tokens taken that matcher_ has not advanced by
  std::string failure_;               // why the grammar cannot be followed; empty: it can
  std::size_t num_output_bytes_ = 0;  // taken by the matcher (for failure_)
  std::vector<TokenId> ends_;  // under a grammar: end-of-generation and stop ids in the vocabulary
  std::vector<float> end_logits_;
};

// log(sum(exp(logits))), in double: the one normalizer of every log-probability.
double log_sum_exp(std::span<const float> logits);

// log-softmax of one row, and its n largest entries (ties: lowest id first).
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, std::int32_t n);

}  // namespace troupe::model
