#include "actors/scheduler_actor.hpp"

#include <any>

#include "actors/worker_actor.hpp"

namespace troupe::actors {

namespace {

using Self = replica_actor::stateful_pointer<SchedulerState>;
void deliver(Self self, engine::RequestUpdate& u) {
  self->send(std::any_cast<const request_actor&>(u.reply_to), token_atom::value,
             static_cast<engine::RequestEvent&&>(std::move(u)));
}

void deliver_all(Self self, std::vector<engine::RequestUpdate>& updates) {
  for (auto& u : updates) deliver(self, u);
}

void record_metrics(Self self, const engine::AppliedStep& step) {
  auto& state = self->state;
  if (!state.metrics) return;
  const EngineStats s = state.core->stats();
  state.metrics->record_iteration(
      {step.worker_seconds, step.num_tokens, step.num_tokens - step.num_decodes,
       static_cast<std::int64_t>(step.updates.size()), s.num_running, s.num_waiting, s.kv_usage,
       s.num_preemptions, s.prefix_queried_tokens, s.prefix_hit_tokens});
}

void maybe_step(Self self);

// A fresh worker loads the same spec; steps wait for it. The lost KV is recomputed.
void replace_worker(Self self) {
  auto& state = self->state;
  self->send_exit(state.worker, caf::exit_reason::kill);
  state.core->reset_worker();
  state.worker_ready = false;
  state.worker = self->home_system().spawn<caf::detached>(worker, state.before_step);
  auto give_up = [self](const std::string& why) {
    // No worker could be made: the open requests end with the reason; the next
    // request's step tries another worker.
    auto updates = self->state.core->end_all(FinishReason::error, why);
    deliver_all(self, updates);
    self->state.worker_ready = true;
  };
  self->request(state.worker, caf::infinite, load_atom::value, state.spec)
      .then(
          [self, give_up](const engine::LoadReport& report) {
            if (report.failed) return give_up(report.error.message);
            self->state.worker_ready = true;
            maybe_step(self);
          },
          [self, give_up](const caf::error& err) { give_up(self->system().render(err)); });
}

void on_output(Self self, const engine::StepOutput& output) {
  auto applied = self->state.core->apply(output);
  deliver_all(self, applied.updates);
  if (!output.failed) record_metrics(self, applied);
  if (applied.worker_lost) replace_worker(self);
  maybe_step(self);
}

// Plans and sends the next step, unless one is in flight or nothing can run.
void maybe_step(Self self) {
  auto& state = self->state;
  if (!state.worker_ready) return;
  auto work = state.core->next_step();
  if (!work) return;
  const std::uint64_t step_id = work->step_id;
  self->request(state.worker, caf::infinite, step_atom::value, std::move(*work))
      .then([self](const engine::StepOutput& output) { on_output(self, output); },
            [self, step_id](const caf::error& err) {
              // The worker died under the step: its requests fail, a new worker takes over.
              const std::string why = "the worker stopped: " + self->system().render(err);
              on_output(self, engine::failed_step(step_id, {ErrorCode::internal, why, true}));
            });
}

}  // namespace

replica_actor::behavior_type scheduler(replica_actor::stateful_pointer<SchedulerState> self,
                                       engine::SchedulerConfig config,
                                       std::vector<TokenId> end_of_generation, worker_actor worker,
                                       engine::WorkerSpec spec, std::function<void()> before_step,
                                       std::shared_ptr<monitoring::Metrics> metrics) {
  auto& state = self->state;
  state.core = std::make_unique<engine::EngineCore>(config, std::move(end_of_generation));
  state.worker = std::move(worker);
  state.spec = std::move(spec);
  state.before_step = std::move(before_step);
  state.metrics = std::move(metrics);
  // On shutdown every open request hears of it, so that none waits forever.
  self->set_exit_handler([self](const caf::exit_msg& msg) {
    auto updates = self->state.core->end_all(FinishReason::abort, "the engine is shutting down");
    deliver_all(self, updates);
    self->send_exit(self->state.worker, caf::exit_reason::kill);
    self->quit(msg.reason);
  });
  return {
      [self](submit_atom, Submission& s) {
        auto added = self->state.core->add(
            {s.id, std::move(s.prompt), std::move(s.params), s.priority, s.requester});
        if (!added) {
          TokenUpdate end;
          end.finish_reason = FinishReason::error;
          end.error = added.error().message;
          self->send(s.requester, token_atom::value, std::move(end));
          return;
        }
        maybe_step(self);
      },
      [self](abort_atom, RequestId id, FinishReason reason) {
        // Blocks are free before the next step is planned.
        if (auto update = self->state.core->cancel(id, reason)) deliver(self, *update);
      },
      [self](stats_atom) -> EngineStats { return self->state.core->stats(); },
      [self](replicas_atom) -> std::vector<ReplicaStats> {
        ReplicaStats alone;
        alone.stats = self->state.core->stats();
        return {alone};
      },
      [self](probe_atom, const std::vector<TokenId>& prompt) -> ReplicaProbe {
        const engine::Scheduler& s = self->state.core->scheduler();
        return {static_cast<std::int32_t>(s.num_waiting()),
                static_cast<std::int32_t>(s.num_running()), s.kv_cache().usage(),
                s.kv_cache().cached_prefix_tokens(prompt)};
      },
  };
}

}  // namespace troupe::actors
