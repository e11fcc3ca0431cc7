#include "model/sampler.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "model/splitmix64.hpp"

namespace troupe::model {

namespace {

constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// Larger value first; ties by lower id.
bool higher(const std::pair<float, TokenId>& a, const std::pair<float, TokenId>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

double log_sum_exp(std::span<const float> logits) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  return max + std::log(sum);
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, std::int32_t n) {
  const double lse = log_sum_exp(logits);
  std::vector<std::pair<float, TokenId>> all(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) all[i] = {logits[i], static_cast<TokenId>(i)};
  const auto k = std::min<std::size_t>(static_cast<std::size_t>(std::max(n, 0)), all.size());
  std::partial_sort(all.begin(), all.begin() + k, all.end(), higher);
  std::vector<TokenLogprob> out;
  out.reserve(k);
  for (std::size_t i = 0; i < k; ++i) {
    out.push_back({all[i].second, static_cast<float>(all[i].first - lse)});
  }
  return out;
}

Result<Sampler> Sampler::create(const SamplingParams& params, std::span<const TokenId> prompt,
                                std::vector<TokenId> end_of_generation, std::int32_t vocab_size,
                                OutputGrammar constraint) {
  auto bad = [](const std::string& what) { return make_error(ErrorCode::invalid_argument, what); };
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature)) {
    return bad("temperature must be a finite number >= 0");
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) return bad("top_p must be in (0, 1]");
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) return bad("min_p must be in [0, 1]");
  if (params.top_k < -1) return bad("top_k must be -1, 0 (off) or positive");
  if (!(params.repetition_penalty > 0.0f) || !std::isfinite(params.repetition_penalty)) {
    return bad("repetition_penalty must be a finite number > 0");
  }
  if (!(params.presence_penalty >= -2.0f && params.presence_penalty <= 2.0f)) {
    return bad("presence_penalty must be in [-2, 2]");
  }
  if (!(params.frequency_penalty >= -2.0f && params.frequency_penalty <= 2.0f)) {
    return bad("frequency_penalty must be in [-2, 2]");
  }
  if (params.logprobs && (*params.logprobs < 0 || *params.logprobs > 20)) {
    return bad("logprobs must be in [0, 20]");
  }
  if (params.prompt_logprobs && (*params.prompt_logprobs < 0 || *params.prompt_logprobs > 20)) {
    return bad("prompt_logprobs must be in [0, 20]");
  }
  if (params.max_tokens < 1) return bad("max_tokens must be at least 1");
  if (params.min_tokens < 0 || params.min_tokens > params.max_tokens) {
    return bad("min_tokens must be in [0, max_tokens]");
  }
  for (TokenId id : params.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return bad("stop token id " + std::to_string(id) + " is outside the vocabulary of " +
                 std::to_string(vocab_size));
    }
  }
  for (TokenId id : params.grammar_after) {
    if (id < 0 || id >= vocab_size) {
      return bad("the grammar's start token id " + std::to_string(id) +
                 " is outside the vocabulary of " + std::to_string(vocab_size));
    }
  }
  if (constraint.grammar && !constraint.masker) {
    return bad("a grammar needs the model's token masker");
  }
  if (constraint.masker && constraint.masker->vocab_size() != vocab_size) {
    return bad("the token masker's vocabulary of " +
               std::to_string(constraint.masker->vocab_size()) + " is not the model's " +
               std::to_string(vocab_size));
  }
  Sampler s;
  if (constraint.grammar) {
    s.matcher_.emplace(std::move(constraint.grammar));
    if (!s.matcher_->ok()) return bad("the grammar's start passes the matcher's limits");
    s.masker_ = std::move(constraint.masker);
    s.device_mask_.assign((static_cast<std::size_t>(vocab_size) + 63) / 64, 0);
  }
  s.params_ = params;
  s.vocab_size_ = vocab_size;
  s.end_of_generation_ = std::move(end_of_generation);
  s.grammar_started_ = params.grammar_after.empty();
  if (s.matcher_) {
    for (const std::vector<TokenId>* ids : {&s.end_of_generation_, &s.params_.stop_token_ids}) {
      for (const TokenId t : *ids) {
        if (t >= 0 && t < vocab_size) s.ends_.push_back(t);
      }
    }
  }
  if (params.repetition_penalty != 1.0f) {
    for (TokenId t : prompt) ++s.prompt_counts_[t];
  }
  // Every draw is a function of the key and the token's position (sampling_draw), on the host
  // and the device alike; a request without a seed gets a random one.
  std::uint64_t seed = 0;
  if (params.seed) {
    seed = *params.seed;
  } else {
    std::random_device device;
    seed = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }
  s.draw_key_ = sampling_key(seed);
  return s;
}

void Sampler::apply_penalties(std::vector<float>& logits) const {
  // OpenAI's logit_bias, first: the penalties then act on the biased logits.
  for (const auto& [t, bias] : params_.logit_bias) {
    if (t >= 0 && t < vocab_size_) logits[t] += bias;
  }
  if (params_.repetition_penalty != 1.0f) {
    auto penalize = [&](TokenId t) {
      float& l = logits[t];
      l = l > 0.0f ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    };
    for (const auto& [t, n] : prompt_counts_) penalize(t);
    for (const auto& [t, n] : output_counts_) {
      if (!prompt_counts_.contains(t)) penalize(t);
    }
  }
  for (const auto& [t, n] : output_counts_) {
    logits[t] -= params_.frequency_penalty * static_cast<float>(n) + params_.presence_penalty;
  }
  // Until min_tokens, the sequence may not end (under a grammar, apply_grammar says).
  if (num_generated() < params_.min_tokens && !constrained()) {
    for (TokenId t : params_.stop_token_ids) logits[t] = kMinusInfinity;
    if (!params_.ignore_eos) {
      for (TokenId t : end_of_generation_) {
        if (t >= 0 && t < vocab_size_) logits[t] = kMinusInfinity;
      }
    }
  }
}

bool Sampler::ends_allowed(bool other) const {
  return !other ||
         (!grammar_broken_ && matcher_->can_end() && num_generated() >= params_.min_tokens);
}

void Sampler::start_mask(MaskWorkers& workers) {
  if (!constrained() || mask_ready_ || job_.job || !failure_.empty()) return;
  if (grammar_broken_) {
    prepare_mask();  // nothing to compute
    return;
  }
  job_.job = std::make_shared<MaskJob>(*matcher_, std::move(taken_), masker_);
  taken_.clear();
  workers.submit(job_.job);
}

namespace {

std::string budget_failure(std::uint64_t budget, std::size_t num_output_bytes, const char* what) {
  return "the output's grammar cannot be followed within its work budget: " + std::string(what) +
         " after " + std::to_string(num_output_bytes) + " bytes of output needs more than " +
         std::to_string(budget) +
         " steps (its alternatives multiply, as in a regex of many '.*'; simplify the "
         "constraint)";
}

}  // namespace

Sampler::MaskState Sampler::mask_state() {
  if (!constrained() || mask_ready_) return MaskState::ready;
  if (!failure_.empty()) return MaskState::failed;
  if (!job_.job) return MaskState::pending;  // not started: start_mask() was not called
  if (!job_.job->done()) return MaskState::pending;
  std::shared_ptr<MaskJob> job = std::move(job_.job);
  take(*job);
  return failure_.empty() ? MaskState::ready : MaskState::failed;
}

void Sampler::take(MaskJob& job) {
  if (job.failed()) {
    // The output so far: the job's bytes too, when they were taken before its mask failed.
    failure_ =
        job.failed_taking()
            ? budget_failure(job.budget(), num_output_bytes_, "taking the next token")
            : budget_failure(job.budget(), num_output_bytes_ + job.num_taken(), "the token mask");
    return;
  }
  if (job.refused()) {
    grammar_broken_ = true;  // only end tokens follow
    mask_.assign((static_cast<std::size_t>(vocab_size_) + 63) / 64, 0);
  } else {
    num_output_bytes_ += job.num_taken();
    matcher_ = std::move(job.state());
    mask_ = std::move(job.mask());
  }
  mask_ready_ = true;
}

bool Sampler::wait_mask_until(MaskJob::Clock::time_point deadline) {
  if (job_.job && !job_.job->wait_until(deadline)) return false;
  return mask_state() != MaskState::pending;
}

void Sampler::prepare_mask() {
  if (!constrained() || mask_ready_) return;
  if (job_.job) {
    job_.job->wait();
    if (mask_state() == MaskState::ready) return;
  }
  if (!grammar_broken_ && failure_.empty()) {
    MaskJob job(*matcher_, std::move(taken_), masker_);  // the same work, here
    taken_.clear();
    job.run();
    take(job);
    if (mask_ready_) return;
  }
  mask_.assign((static_cast<std::size_t>(vocab_size_) + 63) / 64, 0);
  mask_ready_ = true;
}

Sampler::MaskState Sampler::compute_mask() {
  if (!constrained() || mask_ready_) return MaskState::ready;
  if (job_.job) {
    job_.job->wait();
    return mask_state();
  }
  if (!grammar_broken_ && failure_.empty()) {
    MaskJob job(*matcher_, std::move(taken_), masker_);
    taken_.clear();
    job.run();
    take(job);
  }
  return mask_state();
}

std::optional<ProposalGuide> Sampler::proposal_guide() const {
  if (!constrained() || grammar_broken_ || !failure_.empty() || job_.job) return std::nullopt;
  return ProposalGuide(*matcher_, taken_, masker_, ends_);
}

TokenId ProposalGuide::choose(std::span<const float> logits) {
  const auto likeliest = [&] {
    return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  };
  if (!guiding_) return likeliest();
  MaskJob job(std::move(state_), std::move(taken_), masker_);
  taken_.clear();
  job.run();
  if (job.failed() || job.refused()) {
    guiding_ = false;
    return likeliest();
  }
  state_ = std::move(job.state());
  const std::vector<std::uint64_t>& mask = job.mask();
  TokenId best = kNoToken;
  for (std::size_t word = 0; word < mask.size(); ++word) {
    for (std::uint64_t bits = mask[word]; bits != 0; bits &= bits - 1) {
      const auto t =
          static_cast<TokenId>(word * 64 + static_cast<std::size_t>(std::countr_zero(bits)));
      if (static_cast<std::size_t>(t) >= logits.size() ||
          std::find(ends_.begin(), ends_.end(), t) != ends_.end()) {
        continue;
      }
      if (best == kNoToken || logits[t] > logits[best]) best = t;
    }
  }
  if (best == kNoToken) {  // only an end may come: the draft ends here in all but name
    guiding_ = false;
    return likeliest();
  }
  taken_ = masker_->token_bytes(best);
  return best;
}

void Sampler::apply_grammar(std::vector<float>& logits) {
  prepare_mask();
  // An end token is an end whatever its bytes (the mask, over bytes, never allows one that
  // stands for none): kept aside, masked, and let through only by ends_allowed.
  end_logits_.resize(ends_.size());
  for (std::size_t i = 0; i < ends_.size(); ++i) {
    end_logits_[i] = logits[ends_[i]];
    logits[ends_[i]] = kMinusInfinity;
  }
  bool other = false;  // whether a token that continues the output is allowed
  for (std::size_t word = 0; word < mask_.size(); ++word) {
    const std::uint64_t bits = mask_[word];
    const std::size_t first = word * 64;
    const std::size_t last = std::min(first + 64, logits.size());
    if (bits == 0) {
      std::fill(logits.begin() + static_cast<std::ptrdiff_t>(first),
                logits.begin() + static_cast<std::ptrdiff_t>(last), kMinusInfinity);
      continue;
    }
    for (std::size_t t = first; t < last; ++t) {
      if ((bits >> (t - first)) & 1u) {
        other = other || logits[t] != kMinusInfinity;
      } else {
        logits[t] = kMinusInfinity;
      }
    }
  }
  // Nothing may follow (a broken output too): the output ends, whatever min_tokens asked.
  if (!ends_allowed(other)) return;
  for (std::size_t i = 0; i < ends_.size(); ++i) logits[ends_[i]] = end_logits_[i];
  const bool any_end = std::any_of(end_logits_.begin(), end_logits_.end(),
                                   [](float l) { return l != kMinusInfinity; });
  // The model may have put every end token at -inf where one must come: the first then.
  if (!other && !any_end && !ends_.empty()) logits[ends_.front()] = 0.0f;
}

void Sampler::prepare_device_mask() {
  if (!constrained()) return;
  prepare_mask();
  // As apply_grammar, with every allowed token taken as possible (the device sees the
  // logits, the host does not).
  device_mask_ = mask_;
  auto set_ends = [&](bool on) {
    for (const TokenId t : ends_) {
      auto& word = device_mask_[static_cast<std::size_t>(t) / 64];
      const std::uint64_t bit = std::uint64_t{1} << (t % 64);
      word = on ? word | bit : word & ~bit;
    }
  };
  set_ends(false);
  const bool other =
      std::any_of(device_mask_.begin(), device_mask_.end(), [](std::uint64_t w) { return w; });
  set_ends(ends_allowed(other));
}

TokenId Sampler::choose(std::span<const float> logits) {
  if (params_.temperature == 0.0f) {
    return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  double total = 0.0;
  const std::size_t keep = keep_candidates(logits, total);
  if (keep == 0) return 0;
  // A 53-bit uniform draw keyed by (seed, position), so the same seed gives the same tokens
  // on every platform, on the device, and after a resume.
  const auto position = static_cast<std::uint64_t>(num_generated());
  const double u = draw_unit(sampling_draw(draw_key_, position)) * total;
  double cumulative = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    cumulative += probs_[i];
    if (u < cumulative) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

std::size_t Sampler::keep_candidates(std::span<const float> logits, double& total) {
  // Candidates sorted by logit, cut by top-k, then min-p and top-p on their probabilities.
  // NaN is no candidate: it has no place in the order (and the device drops it too).
  candidates_.clear();
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] > kMinusInfinity) candidates_.emplace_back(logits[i], static_cast<TokenId>(i));
  }
  total = 0.0;
  if (candidates_.empty()) return 0;
  std::size_t keep = candidates_.size();
  if (params_.top_k > 0)
    keep = std::min<std::size_t>(keep, static_cast<std::size_t>(params_.top_k));
  // Plain temperature sampling needs no order: skip the sort over the whole vocabulary.
  if (params_.top_k > 0 || params_.top_p < 1.0f || params_.min_p > 0.0f) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), higher);
    candidates_.resize(keep);
  }
  float max_logit = kMinusInfinity;
  for (const auto& c : candidates_) max_logit = std::max(max_logit, c.first);
  std::vector<double>& probs = probs_;
  probs.resize(keep);
  const float inverse_temperature = 1.0f / params_.temperature;
  for (std::size_t i = 0; i < keep; ++i) {
    // exp in float (each term is in (0, 1]); the sums run in double.
    probs[i] = std::exp((candidates_[i].first - max_logit) * inverse_temperature);
    total += probs[i];
  }
  if (params_.min_p > 0.0f) {
    const double threshold = params_.min_p * probs[0];  // sorted: probs[0] is the largest
    while (keep > 1 && probs[keep - 1] < threshold) total -= probs[--keep];
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    std::size_t cut = keep;
    for (std::size_t i = 0; i < keep; ++i) {
      cumulative += probs[i];
      if (cumulative >= params_.top_p * total) {
        cut = i + 1;
        break;
      }
    }
    total = 0.0;
    for (std::size_t i = 0; i < cut; ++i) total += probs[i];
    keep = cut;
  }
  return keep;
}

std::vector<TokenId> Sampler::kept_tokens(std::span<const float> logits) {
  TROUPE_ASSERT(params_.temperature > 0.0f, "kept_tokens is for drawn, not greedy, outputs");
  double total = 0.0;
  const std::size_t keep = keep_candidates(logits, total);
  std::vector<TokenId> ids(keep);
  for (std::size_t i = 0; i < keep; ++i) ids[i] = candidates_[i].second;
  return ids;
}

SampledToken Sampler::sample(std::span<const float> logits) {
  TROUPE_ASSERT(static_cast<std::int32_t>(logits.size()) == vocab_size_,
                "logits of the wrong size");
  SampledToken result;
  scratch_.assign(logits.begin(), logits.end());
  apply_penalties(scratch_);
  if (constrained()) apply_grammar(scratch_);
  // temperature scaling is folded into choose(); greedy ignores it.
  result.id = choose(scratch_);
  // Log-probabilities cost a pass over the vocabulary: only when asked.
  if (params_.logprobs) {
    const double lse = log_sum_exp(logits);
    result.logprob = static_cast<float>(logits[result.id] - lse);
    if (*params_.logprobs > 0) result.top_logprobs = top_logprobs(logits, *params_.logprobs);
  }

  record(result.id);
  return result;
}

void Sampler::record(TokenId id) {
  output_.push_back(id);
  ++output_counts_[id];
  if (matcher_ && !grammar_started_) {
    // The grammar holds from the token after grammar_after, once the output ends with it.
    const auto& after = params_.grammar_after;
    grammar_started_ = output_.size() >= after.size() &&
                       std::equal(after.begin(), after.end(), output_.end() - after.size());
    return;
  }
  if (!constrained()) return;
  mask_ready_ = false;
  job_ = JobHandle{};  // a mask still computed for the position before is of no use now
  // An end token ends the output (the engine's stop rule); any other advances the grammar,
  // with the next mask's work (off the step: MaskJob), not here.
  if (grammar_broken_ || std::find(ends_.begin(), ends_.end(), id) != ends_.end()) return;
  taken_ += masker_->token_bytes(id);
}

std::optional<DeviceSamplingRow> Sampler::device_row() const {
  const bool penalties = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                         params_.frequency_penalty != 0.0f;
  if (penalties || params_.logprobs || !params_.logit_bias.empty() ||
      (num_generated() < params_.min_tokens && !constrained())) {
    return std::nullopt;
  }
  DeviceSamplingRow row;
  row.temperature = params_.temperature;
  row.top_k = params_.top_k > 0 ? params_.top_k : 0;
  row.top_p = params_.top_p;
  row.min_p = params_.min_p;
  row.seed = draw_key_;
  row.counter = static_cast<std::uint64_t>(num_generated());
  if (constrained()) row.allowed = device_mask_.data();
  return row;
}

Result<void> Sampler::resume(std::span<const TokenId> generated) {
  for (const TokenId id : generated) {
    if (id < 0 || id >= vocab_size_) {
      return make_error(ErrorCode::invalid_argument, "a resumed token id " + std::to_string(id) +
                                                         " is outside the vocabulary of " +
                                                         std::to_string(vocab_size_));
    }
  }
  for (const TokenId id : generated) record(id);
  return {};
}

SampledToken Sampler::accept(TokenId id) {
  TROUPE_ASSERT(id >= 0 && id < vocab_size_, "a device sampled a token outside the vocabulary");
  SampledToken result;
  result.id = id;
  record(id);
  return result;
}

}  // namespace troupe::model
