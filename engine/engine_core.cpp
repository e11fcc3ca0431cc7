#include "engine/engine_core.hpp"

#include <algorithm>

#include "engine/step_builder.hpp"

namespace troupe::engine {

EngineCore::EngineCore(const SchedulerConfig& config, std::vector<TokenId> end_of_generation,
                       std::optional<TokenBudgetConfig> token_budget)
    : scheduler_(config), end_of_generation_(std::move(end_of_generation)) {
  if (token_budget) token_budget_.emplace(*token_budget);
}

void EngineCore::calibrate(std::span<const StepCost> steps) {
  if (token_budget_) token_budget_->calibrate(steps);
}

Result<void> EngineCore::add(CoreRequest request) {
  const std::int32_t max_tokens = request.params.max_tokens;
  const auto num_scores = static_cast<std::size_t>(request.prompt.size()) - 1;
  StopRule stop(request.params, end_of_generation_);
  const bool resumed = !request.resumed.empty();
  TROUPE_TRY_VOID(scheduler_.add({request.id, std::move(request.prompt), max_tokens,
                                  request.priority, std::move(stop), request.params.prompt_logprobs,
                                  request.adapter, std::move(request.resumed)}));
  LiveRequest live;
  live.arrival = std::chrono::steady_clock::now();
  live.params = std::move(request.params);
  live.reply_to = std::move(request.reply_to);
  if (resumed) {
    // Its first token and its prompt's scores went out with the earlier run.
    live.has_token = true;
    live.first_token = live.arrival;
    live.prompt_logprobs_sent = true;
  } else if (live.params.prompt_logprobs) {
    live.prompt_logprobs.resize(num_scores);
  }
  requests_.emplace(request.id, std::move(live));
  return {};
}

void EngineCore::attach_prompt_logprobs(LiveRequest& request, RequestEvent& event) {
  if (!request.params.prompt_logprobs || request.prompt_logprobs_sent) return;
  if (request.num_scored != static_cast<std::int32_t>(request.prompt_logprobs.size())) return;
  event.prompt_logprobs = std::move(request.prompt_logprobs);
  request.prompt_logprobs_sent = true;
}

void EngineCore::note_first_token(SeqId id, LiveRequest& request, const model::SampledToken& token,
                                  AppliedStep& applied) {
  if (token.id == kNoToken) return;
  if (request.has_token) {
    ++request.num_after_first;
    return;
  }
  request.has_token = true;
  request.first_token = std::chrono::steady_clock::now();
  applied.first_tokens.push_back(
      {id, std::chrono::duration<double>(request.first_token - request.arrival).count()});
}

std::optional<double> EngineCore::slo_step_seconds(std::chrono::steady_clock::time_point now) {
  progress_.clear();
  for (const auto& [id, request] : requests_) {
    if (!request.has_token) continue;
    const Sequence* seq = scheduler_.find(id);
    if (seq == nullptr || seq->is_prefilling()) continue;  // not decoding (a recompute)
    progress_.push_back({request.num_after_first,
                         std::chrono::duration<double>(now - request.first_token).count()});
  }
  return tpot_step_seconds(token_budget_->config(), progress_);
}

bool EngineCore::backlogged(std::chrono::steady_clock::time_point now) const {
  const TokenBudgetConfig& c = token_budget_->config();
  if (!(c.decode_step_multiple > 0) || c.backlog_wait_seconds < 0) return false;
  const auto waited = std::chrono::duration<double>(c.backlog_wait_seconds);
  // In arrival order under fcfs, so the first is the oldest; under priority any may be.
  for (const SeqId id : scheduler_.waiting()) {
    const auto it = requests_.find(id);
    if (it != requests_.end() && now - it->second.arrival >= waited) return true;
  }
  return false;
}

bool EngineCore::scores_match(const InFlight& step, const StepOutput& output) {
  if (output.prompt_logprobs.size() != step.prompt_rows.size()) return false;
  for (std::size_t i = 0; i < step.prompt_rows.size(); ++i) {
    const auto& asked = step.prompt_rows[i];
    const auto& got = output.prompt_logprobs[i];
    if (got.id != asked.id || got.first_position != asked.first_position ||
        got.entries.size() != asked.targets.size()) {
      return false;
    }
  }
  return true;
}

void EngineCore::keep_scores(const StepOutput& output) {
  for (const model::PromptLogprobs& scores : output.prompt_logprobs) {
    const auto it = requests_.find(scores.id);
    if (it == requests_.end()) continue;  // cancelled while the step ran
    LiveRequest& request = it->second;
    auto position = static_cast<std::size_t>(scores.first_position);
    for (const PromptLogprob& entry : scores.entries) {
      if (position >= request.prompt_logprobs.size()) break;
      request.prompt_logprobs[position++] = entry;
    }
    // Chunks run in order from position 0, so what lies below the furthest is known.
    request.num_scored = std::max(request.num_scored, static_cast<std::int32_t>(position));
  }
}

AddressedEvent EngineCore::end_update(SeqId id, LiveRequest& request, FinishReason reason,
                                      std::string error, ErrorCode error_code) {
  AddressedEvent update;
  update.id = id;
  update.reply_to = std::move(request.reply_to);
  update.finish_reason = reason;
  update.error = std::move(error);
  update.error_code = error_code;
  update.first_scheduled = request.first_scheduled;
  attach_prompt_logprobs(request, update);
  return update;
}

void EngineCore::forget(SeqId id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (it->second.announced) removed_.push_back(id);
  requests_.erase(it);
}

std::optional<AddressedEvent> EngineCore::cancel(SeqId id, FinishReason reason, std::string error,
                                                 ErrorCode error_code) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return std::nullopt;
  scheduler_.abort(id);
  auto update = end_update(id, it->second, reason, std::move(error), error_code);
  forget(id);
  return update;
}

std::vector<AddressedEvent> EngineCore::end_all(FinishReason reason, const std::string& error) {
  std::vector<SeqId> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, request] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  std::vector<AddressedEvent> updates;
  for (SeqId id : ids) updates.push_back(*cancel(id, reason, error));
  return updates;
}

namespace {

// Adds the time until it goes out of scope to `total`.
struct Timed {
  double& total;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~Timed() {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

}  // namespace

bool EngineCore::in_flight(std::uint64_t step_id) const {
  return std::any_of(in_flight_.begin(), in_flight_.end(),
                     [step_id](const InFlight& step) { return step.step_id == step_id; });
}

std::optional<StepWork> EngineCore::next_step() {
  const auto most = static_cast<std::size_t>(scheduler_.config().max_steps_in_flight);
  if (in_flight_.size() >= most || !scheduler_.has_unfinished()) return std::nullopt;
  const Timed timed{counters_.schedule_seconds};
  if (token_budget_) {
    const TokenBudgetConfig& c = token_budget_->config();
    const auto now = std::chrono::steady_clock::now();
    std::optional<double> seconds;
    if (c.target_tpot_seconds > 0) {
      seconds = slo_step_seconds(now);
    } else if (backlogged(now)) {
      seconds = c.target_step_seconds;
    }
    scheduler_.set_token_budget(token_budget_->step_budget(scheduler_.num_decoding(), seconds));
  }
  InFlight flight;
  flight.plan = scheduler_.schedule();
  if (flight.plan.chunks.empty()) return std::nullopt;
  scheduler_.start(flight.plan);
  StepWork work;
  work.step_id = flight.step_id = next_step_id_++;
  work.step = build_step_input(flight.plan, scheduler_, &work.sampled_ids, &work.prompt_rows,
                               &work.num_drafts, &work.drafts);
  work.removed.swap(removed_);
  const auto now = std::chrono::steady_clock::now();
  for (const ScheduledChunk& chunk : flight.plan.chunks) {
    LiveRequest& request = requests_.at(chunk.id);
    if (request.announced) continue;
    const Sequence* seq = scheduler_.find(chunk.id);
    // A sequence met again (a new worker) or resumed brings the tokens it generated so far.
    const auto prompt_end = seq->tokens.begin() + seq->num_prompt_tokens;
    work.new_sequences.push_back({chunk.id, request.params,
                                  std::vector<TokenId>(seq->tokens.begin(), prompt_end),
                                  std::vector<TokenId>(prompt_end, seq->tokens.end())});
    request.announced = true;
    if (request.first_scheduled.time_since_epoch().count() == 0) request.first_scheduled = now;
  }
  ++counters_.num_steps;
  counters_.num_step_tokens += flight.plan.num_tokens;
  counters_.num_step_sequences += static_cast<std::int64_t>(flight.plan.chunks.size());
  counters_.peak_kv_usage = std::max(counters_.peak_kv_usage, scheduler_.kv_cache().usage());
  flight.sampled_ids = work.sampled_ids;
  flight.num_drafts = work.num_drafts;
  flight.prompt_rows = work.prompt_rows;
  in_flight_.push_back(std::move(flight));
  return work;
}

AppliedStep EngineCore::fail_steps(std::span<const InFlight> steps, const WorkerError& error) {
  // A lost worker (fatal): the steps' sequences resume on the next one (reset_worker), as
  // do the others, unless the worker was lost under them too often. Otherwise the step's
  // sequences end with the error; the others carry on.
  AppliedStep applied;
  applied.worker_lost = error.fatal;
  for (const InFlight& step : steps) {
    for (const ScheduledChunk& chunk : step.plan.chunks) {
      const auto it = requests_.find(chunk.id);
      if (error.fatal && it != requests_.end() && ++it->second.num_migrations <= kMaxMigrations) {
        continue;
      }
      std::string why = error.message;
      if (error.fatal) {
        why += " (its worker was lost under it " + std::to_string(kMaxMigrations + 1) + " times)";
      }
      if (auto update = cancel(chunk.id, FinishReason::error, why)) {
        applied.updates.push_back(std::move(*update));
      }
    }
  }
  return applied;
}

bool EngineCore::drafts_match(const InFlight& step, const StepOutput& output) {
  if (step.plan.num_draft_tokens == 0) return output.num_more.empty() && output.more_tokens.empty();
  if (output.num_more.size() != step.sampled_ids.size()) return false;
  std::size_t total = 0;
  for (std::size_t i = 0; i < output.num_more.size(); ++i) {
    const std::int32_t n = output.num_more[i];
    if (n < 0 || n > step.num_drafts[i] || (n > 0 && output.tokens[i].id == kNoToken)) return false;
    total += static_cast<std::size_t>(n);
  }
  return total == output.more_tokens.size();
}

void EngineCore::note_speculation(const InFlight& step, const StepOutput& output) {
  if (step.plan.num_draft_tokens == 0) return;
  for (std::size_t i = 0; i < step.num_drafts.size(); ++i) {
    const std::int32_t proposed = step.num_drafts[i];
    if (proposed == 0) continue;
    // A sequence that got no token this step verified nothing: its draft is not counted.
    if (output.tokens[i].id == kNoToken) continue;
    const std::int32_t accepted = output.num_more[i];
    ++counters_.spec.num_drafts;
    counters_.spec.num_draft_tokens += proposed;
    counters_.spec.num_accepted_tokens += accepted;
    auto& per_pos = counters_.spec.num_accepted_tokens_per_pos;
    if (per_pos.size() < static_cast<std::size_t>(proposed)) per_pos.resize(proposed, 0);
    for (std::int32_t p = 0; p < accepted; ++p) ++per_pos[p];
  }
}

AppliedStep EngineCore::apply(const StepOutput& output) {
  TROUPE_ASSERT(!in_flight_.empty(), "a step output with no step in flight");
  const Timed timed{counters_.schedule_seconds};
  counters_.step_seconds += output.seconds;
  InFlight step = std::move(in_flight_.front());
  in_flight_.pop_front();
  AppliedStep applied;
  const bool fatal = output.failed ? output.error.fatal
                                   : output.step_id != step.step_id ||
                                         output.tokens.size() != step.sampled_ids.size() ||
                                         !scores_match(step, output) || !drafts_match(step, output);
  if (fatal) {
    // The worker is lost, and every step in flight with it.
    std::vector<InFlight> lost;
    lost.push_back(std::move(step));
    while (!in_flight_.empty()) {
      lost.push_back(std::move(in_flight_.front()));
      in_flight_.pop_front();
    }
    applied = fail_steps(
        lost, output.failed
                  ? output.error
                  : WorkerError{ErrorCode::internal, "the worker answered another step", true});
    step = std::move(lost.front());
  } else if (output.failed) {
    applied = fail_steps(std::span(&step, 1), output.error);
  } else {
    keep_scores(output);
    // Each sampled sequence's tokens: its first, then those its draft's verification
    // accepted (output.more_tokens, num_more[i] of them for sequence i).
    std::vector<SampledResult> sampled;
    sampled.reserve(output.tokens.size());
    std::vector<std::size_t> more_start(output.tokens.size(), 0);
    std::size_t next_more = 0;
    for (std::size_t i = 0; i < output.tokens.size(); ++i) {
      SampledResult result{output.tokens[i].id};
      more_start[i] = next_more;
      const std::int32_t num_more = output.num_more.empty() ? 0 : output.num_more[i];
      for (std::int32_t j = 0; j < num_more; ++j) {
        result.more.push_back(output.more_tokens[next_more++].id);
      }
      sampled.push_back(std::move(result));
    }
    note_speculation(step, output);
    if (step.plan.num_draft_tokens > 0) applied.num_accepted = output.num_more;
    // Read before update(): a finished sequence is gone after it.
    std::vector<std::int32_t> cached(step.sampled_ids.size(), 0);
    std::vector<std::int32_t> num_before(step.sampled_ids.size(), 0);
    for (std::size_t i = 0; i < step.sampled_ids.size(); ++i) {
      if (const Sequence* seq = scheduler_.find(step.sampled_ids[i])) {
        cached[i] = seq->num_cached_tokens;
        num_before[i] = seq->num_tokens();
      }
    }
    const auto finished = scheduler_.update(step.plan, sampled);
    // The tokens each sequence took (a draft's tokens past its end are dropped).
    std::vector<std::int32_t> num_taken(step.sampled_ids.size(), 0);
    for (std::size_t i = 0; i < step.sampled_ids.size(); ++i) {
      const SeqId id = step.sampled_ids[i];
      const auto end = std::find_if(finished.begin(), finished.end(),
                                    [id](const FinishedSequence& f) { return f.id == id; });
      if (end != finished.end()) {
        num_taken[i] = end->num_tokens - num_before[i];
      } else if (const Sequence* seq = scheduler_.find(id)) {
        num_taken[i] = seq->num_tokens() - num_before[i];
      }
    }
    // Tokens generated: those each sequence took (a cancelled one's all count, as before).
    std::int32_t num_sampled = 0;
    for (std::size_t i = 0; i < output.tokens.size(); ++i) {
      if (output.tokens[i].id == kNoToken) continue;
      num_sampled +=
          num_taken[i] > 0 ? num_taken[i] : 1 + (output.num_more.empty() ? 0 : output.num_more[i]);
    }
    counters_.num_prompt_tokens +=
        step.plan.num_tokens - step.plan.num_decodes - step.plan.num_draft_tokens;
    counters_.num_generated_tokens += num_sampled;
    applied.num_generated = num_sampled;
    if (token_budget_) {
      // A draft model's catching up is in the step's time: it counts as tokens run.
      token_budget_->observe({step.plan.num_tokens + step.plan.num_catch_up_tokens,
                              step.plan.num_decodes, output.seconds});
    }
    if (step.plan.num_tokens > 0 && step.plan.num_tokens == step.plan.num_decodes) {
      ++counters_.num_decode_steps;
      counters_.decode_step_seconds += output.seconds;
    }
    for (std::size_t i = 0; i < step.sampled_ids.size(); ++i) {
      const SeqId id = step.sampled_ids[i];
      const auto it = requests_.find(id);
      if (it == requests_.end()) continue;  // cancelled while the step ran
      if (output.tokens[i].id == kNoToken) {
        // No token: its grammar's mask was late (the position runs again), or the worker
        // says why the sequence cannot go on (its constraint: the request's fault).
        if (output.tokens[i].error.empty()) continue;
        applied.updates.push_back(
            *cancel(id, FinishReason::error, output.tokens[i].error, ErrorCode::invalid_argument));
        continue;
      }
      // One update per token the sequence took, in order; the last carries its end.
      const auto end = std::find_if(finished.begin(), finished.end(),
                                    [id](const FinishedSequence& f) { return f.id == id; });
      const std::int32_t count = std::max(num_taken[i], 1);
      for (std::int32_t t = 0; t < count; ++t) {
        AddressedEvent update;
        update.id = id;
        update.token = t == 0 ? output.tokens[i] : output.more_tokens[more_start[i] + t - 1];
        update.num_cached_tokens = cached[i];
        update.first_scheduled = it->second.first_scheduled;
        note_first_token(id, it->second, update.token, applied);
        if (t == 0) attach_prompt_logprobs(it->second, update);
        if (t + 1 == count && end != finished.end()) {
          update.finish_reason = end->reason;
          update.reply_to = std::move(it->second.reply_to);
          forget(id);
        } else {
          update.reply_to = it->second.reply_to;
        }
        applied.updates.push_back(std::move(update));
      }
    }
  }
  applied.num_tokens = step.plan.num_tokens;
  applied.num_decodes = step.plan.num_decodes;
  applied.worker_seconds = output.seconds;
  applied.plan = std::move(step.plan);
  return applied;
}

EngineStats EngineCore::stats() const {
  EngineStats s;
  const auto& kv = scheduler_.kv_cache();
  s.num_running = static_cast<std::int32_t>(scheduler_.num_running());
  s.num_waiting = static_cast<std::int32_t>(scheduler_.num_waiting());
  s.kv_usage = kv.usage();
  s.peak_kv_usage = counters_.peak_kv_usage;
  s.num_preemptions = scheduler_.num_preemptions();
  s.prefix_queried_tokens = kv.prefix_stats().num_queried_tokens;
  s.prefix_hit_tokens = kv.prefix_stats().num_hit_tokens;
  s.num_steps = counters_.num_steps;
  s.num_step_tokens = counters_.num_step_tokens;
  s.num_step_sequences = counters_.num_step_sequences;
  s.num_prompt_tokens = counters_.num_prompt_tokens;
  s.num_generated_tokens = counters_.num_generated_tokens;
  s.num_worker_restarts = counters_.num_worker_restarts;
  s.step_seconds = counters_.step_seconds;
  s.num_decode_steps = counters_.num_decode_steps;
  s.decode_step_seconds = counters_.decode_step_seconds;
  s.schedule_seconds = counters_.schedule_seconds;
  s.num_kv_blocks = scheduler_.config().num_blocks;
  s.block_size = scheduler_.config().block_size;
  s.prefix_cache_blocks = static_cast<std::int64_t>(kv.prefix_cache().size());
  s.spec_num_drafts = counters_.spec.num_drafts;
  s.spec_num_draft_tokens = counters_.spec.num_draft_tokens;
  s.spec_num_accepted_tokens = counters_.spec.num_accepted_tokens;
  s.spec_num_accepted_tokens_per_pos = counters_.spec.num_accepted_tokens_per_pos;
  return s;
}

std::int64_t EngineCore::reset_worker() {
  in_flight_.clear();  // lost with the worker (apply() dropped them already)
  scheduler_.reset_kv_cache();
  std::int64_t migrated = 0;
  for (auto& [id, request] : requests_) {
    if (request.announced) ++migrated;
    request.announced = false;
  }
  removed_.clear();
  ++counters_.num_worker_restarts;
  return migrated;
}

void EngineCore::move_out(std::span<const SeqId> ids, const std::string& error, LostWorker& lost) {
  for (SeqId id : ids) {
    const Sequence* seq = scheduler_.find(id);
    if (seq == nullptr) {
      lost.ended.push_back(*cancel(id, FinishReason::error, error));
      continue;
    }
    // It moves on with the tokens it sent: another replica continues its stream.
    auto& request = requests_.at(id);
    CoreRequest again;
    again.id = id;
    const auto prompt_end = seq->tokens.begin() + seq->num_prompt_tokens;
    again.prompt.assign(seq->tokens.begin(), prompt_end);
    again.resumed.assign(prompt_end, seq->tokens.end());
    again.params = std::move(request.params);
    again.priority = seq->priority;
    again.reply_to = std::move(request.reply_to);
    again.adapter = seq->adapter;
    if (!again.resumed.empty()) ++lost.num_resumed;
    scheduler_.abort(id);
    forget(id);
    lost.unstarted.push_back(std::move(again));
  }
}

EngineCore::LostWorker EngineCore::take_waiting() {
  const std::vector<SeqId> ids(scheduler_.waiting().begin(), scheduler_.waiting().end());
  LostWorker taken;
  move_out(ids, "", taken);
  return taken;
}

EngineCore::LostWorker EngineCore::lose_worker(const std::string& error) {
  in_flight_.clear();
  std::vector<SeqId> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, request] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  LostWorker lost;
  move_out(ids, error, lost);
  // The next worker starts empty: nothing to recompute, nothing to tell it to forget.
  scheduler_.reset_kv_cache();
  removed_.clear();
  ++counters_.num_worker_restarts;
  return lost;
}

}  // namespace troupe::engine
