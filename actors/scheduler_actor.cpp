#include "actors/scheduler_actor.hpp"

#include <chrono>

#include "engine/step_builder.hpp"

namespace troupe::actors {

namespace {

using Self = scheduler_actor::stateful_pointer<SchedulerState>;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Tells a request it is over, and forgets it.
void end_request(Self self, RequestId id, FinishReason reason, const std::string& error = {}) {
  auto& state = self->state;
  const auto it = state.requests.find(id);
  if (it == state.requests.end()) return;
  TokenUpdate end;
  end.finish_reason = reason;
  end.error = error;
  self->send(it->second.requester, token_atom::value, std::move(end));
  if (it->second.known_to_worker) state.removed.push_back(id);
  state.requests.erase(it);
}

Result<void> spawn_worker(Self self) {
  auto& state = self->state;
  auto resources = state.make_worker();
  if (!resources) return tl::unexpected(resources.error());
  auto holder = std::make_shared<std::unique_ptr<WorkerResources>>(std::move(*resources));
  state.worker = self->home_system().spawn<caf::detached>(worker, holder, state.before_step);
  return {};
}

// The worker's memory is gone: every running sequence recomputes, nothing is cached.
void replace_worker(Self self) {
  auto& state = self->state;
  self->send_exit(state.worker, caf::exit_reason::kill);
  state.scheduler->reset_kv_cache();
  for (auto& [id, request] : state.requests) request.known_to_worker = false;
  state.removed.clear();
  ++state.stats.num_worker_restarts;
  if (auto spawned = spawn_worker(self); !spawned) {
    // No worker can be made: every request ends with the reason.
    std::vector<RequestId> ids;
    for (const auto& [id, request] : state.requests) ids.push_back(id);
    for (RequestId id : ids) {
      state.scheduler->abort(id);
      end_request(self, id, FinishReason::error, spawned.error().message);
    }
  }
}

void maybe_step(Self self);

void record_metrics(Self self, const engine::BatchPlan& plan, double step_seconds,
                    std::int64_t num_sampled) {
  auto& state = self->state;
  if (!state.metrics) return;
  auto& m = *state.metrics;
  const auto& kv = state.scheduler->kv_cache();
  m.observe_iteration(step_seconds, plan.num_tokens);
  m.add_tokens(plan.num_tokens - plan.num_decodes, num_sampled);
  m.set_queue(static_cast<std::int64_t>(state.scheduler->num_running()),
              static_cast<std::int64_t>(state.scheduler->num_waiting()), kv.usage());
  m.add_preemptions(state.scheduler->num_preemptions() - state.reported_preemptions);
  state.reported_preemptions = state.scheduler->num_preemptions();
  const auto& prefix = kv.prefix_stats();
  m.add_prefix_cache(prefix.num_queried_tokens - state.reported_queried,
                     prefix.num_hit_tokens - state.reported_hits);
  state.reported_queried = prefix.num_queried_tokens;
  state.reported_hits = prefix.num_hit_tokens;
}

void on_step_done(Self self, const engine::BatchPlan& plan, const std::vector<std::uint64_t>& ids,
                  const StepOutputPtr& out) {
  auto& state = self->state;
  state.step_in_flight = false;
  state.stats.step_seconds += out->seconds;
  if (!out->error.empty()) {
    // The step's sequences end with the error; the others carry on.
    for (const auto& chunk : plan.chunks) {
      if (state.scheduler->abort(chunk.id)) {
        end_request(self, chunk.id, FinishReason::error, out->error);
      }
    }
    if (out->worker_broken) replace_worker(self);
    maybe_step(self);
    return;
  }
  const auto start = Clock::now();
  std::vector<engine::SampledResult> sampled;
  sampled.reserve(out->results.size());
  for (const auto& r : out->results) sampled.push_back({r.sampled.id, r.finish_reason});
  // Sequences aborted while the step ran are skipped by update(); so are their tokens here.
  std::vector<bool> alive(ids.size());
  std::vector<std::int32_t> cached(ids.size(), 0);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    alive[i] = state.requests.contains(ids[i]);
    if (const auto* seq = state.scheduler->find(ids[i])) cached[i] = seq->num_cached_tokens;
  }
  const auto finished = state.scheduler->update(plan, sampled);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (!alive[i]) continue;
    const auto it = state.requests.find(ids[i]);
    const auto& r = out->results[i];
    TokenUpdate update;
    update.token = r.sampled.id;
    update.logprob = r.sampled.logprob;
    for (const auto& t : r.sampled.top_logprobs) update.top_logprobs.push_back({t.id, t.logprob});
    update.num_cached_tokens = cached[i];
    update.first_scheduled = it->second.first_scheduled;
    for (const auto& f : finished) {
      if (f.id == ids[i]) update.finish_reason = f.reason;
    }
    self->send(it->second.requester, token_atom::value, std::move(update));
    if (update.finish_reason != FinishReason::none) {
      state.removed.push_back(ids[i]);
      state.requests.erase(it);
    }
  }
  record_metrics(self, plan, out->seconds, static_cast<std::int64_t>(ids.size()));
  state.stats.schedule_seconds += seconds_since(start);
  maybe_step(self);
}

// Plans and sends the next step, unless one is in flight or nothing can run.
void maybe_step(Self self) {
  auto& state = self->state;
  if (state.step_in_flight || !state.scheduler->has_unfinished()) return;
  const auto start = Clock::now();
  auto plan = std::make_shared<engine::BatchPlan>(state.scheduler->schedule());
  if (plan->chunks.empty()) return;
  auto work = std::make_shared<StepWork>();
  work->step = engine::build_step_input(*plan, *state.scheduler, &work->sampled_ids);
  work->removed.swap(state.removed);
  for (const auto& chunk : plan->chunks) {
    auto& request = state.requests.at(chunk.id);
    if (!request.known_to_worker) {
      work->new_sequences.push_back({chunk.id, request.params, request.prompt});
      if (request.first_scheduled.time_since_epoch().count() == 0) {
        request.first_scheduled = Clock::now();
      }
      if (state.metrics && request.submitted.time_since_epoch().count() != 0) {
        state.metrics->observe_queue_time(seconds_since(request.submitted));
        request.submitted = {};  // once: a restarted worker re-learns it, the queue does not
      }
      request.known_to_worker = true;
    }
  }
  auto& stats = state.stats;
  ++stats.num_steps;
  stats.num_step_tokens += plan->num_tokens;
  stats.num_step_sequences += static_cast<std::int64_t>(plan->chunks.size());
  stats.peak_kv_usage = std::max(stats.peak_kv_usage, state.scheduler->kv_cache().usage());
  stats.schedule_seconds += seconds_since(start);
  state.step_in_flight = true;
  auto ids = std::make_shared<std::vector<std::uint64_t>>(work->sampled_ids);
  self->request(state.worker, caf::infinite, step_atom::value, StepWorkPtr(work))
      .then([self, plan, ids](const StepOutputPtr& out) { on_step_done(self, *plan, *ids, out); },
            [self, plan](const caf::error& err) {
              // The worker died under the step: its requests fail, a new worker takes over.
              auto out = std::make_shared<StepOutput>();
              out->error = "the worker stopped: " + self->system().render(err);
              out->worker_broken = true;
              on_step_done(self, *plan, {}, out);
            });
}

}  // namespace

scheduler_actor::behavior_type scheduler(
    scheduler_actor::stateful_pointer<SchedulerState> self, engine::SchedulerConfig config,
    std::shared_ptr<std::unique_ptr<WorkerResources>> first_worker, WorkerFactory make_worker,
    std::function<void()> before_step, std::shared_ptr<monitoring::Metrics> metrics) {
  auto& state = self->state;
  state.metrics = std::move(metrics);
  state.scheduler = std::make_unique<engine::Scheduler>(config);
  state.make_worker = std::move(make_worker);
  state.before_step = std::move(before_step);
  state.stats.num_kv_blocks = config.num_blocks;
  state.stats.block_size = config.block_size;
  state.worker = self->home_system().spawn<caf::detached>(worker, first_worker, state.before_step);
  // On shutdown every open request hears of it, so that none waits forever.
  self->set_exit_handler([self](const caf::exit_msg& msg) {
    std::vector<RequestId> ids;
    for (const auto& [id, request] : self->state.requests) ids.push_back(id);
    for (RequestId id : ids)
      end_request(self, id, FinishReason::abort, "the engine is shutting down");
    self->send_exit(self->state.worker, caf::exit_reason::kill);
    self->quit(msg.reason);
  });
  return {
      [self](submit_atom, Submission& s) {
        auto& state = self->state;
        auto added = state.scheduler->add({s.id, s.prompt, s.params.max_tokens, s.priority});
        if (!added) {
          TokenUpdate end;
          end.finish_reason = FinishReason::error;
          end.error = added.error().message;
          self->send(s.requester, token_atom::value, std::move(end));
          return;
        }
        state.requests.emplace(
            s.id,
            ActiveRequest{
                std::move(s.requester), s.params, std::move(s.prompt), false, s.submitted, {}});
        maybe_step(self);
      },
      [self](abort_atom, RequestId id, FinishReason reason) {
        // Blocks are free before the next step is planned.
        if (self->state.scheduler->abort(id)) end_request(self, id, reason);
      },
      [self](stats_atom) -> EngineStats {
        auto& state = self->state;
        EngineStats s = state.stats;
        s.num_running = static_cast<std::int32_t>(state.scheduler->num_running());
        s.num_waiting = static_cast<std::int32_t>(state.scheduler->num_waiting());
        s.kv_usage = state.scheduler->kv_cache().usage();
        s.num_preemptions = state.scheduler->num_preemptions();
        s.prefix_queried_tokens = state.scheduler->kv_cache().prefix_stats().num_queried_tokens;
        s.prefix_hit_tokens = state.scheduler->kv_cache().prefix_stats().num_hit_tokens;
        return s;
      },
  };
}

}  // namespace troupe::actors
