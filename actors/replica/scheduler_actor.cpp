#include "actors/replica/scheduler_actor.hpp"

#include "actors/replica/replica_drain.hpp"
#include "actors/replica/worker_keeping.hpp"

namespace troupe::actors {

namespace {

using Self = SchedulerSelf;

// Applies the output of the oldest step in flight, then those of later steps that came
// before it, in order; then plans the next steps.
void on_output(Self self, const engine::StepOutput& output, double round_trip_seconds = 0.0) {
  auto& state = self->state;
  auto applied = state.core->apply(output);
  deliver_all(self, applied.updates);
  if (!output.failed) {
    state.observer->on_step(*state.core, applied, round_trip_seconds);
    state.observer->on_pipeline_hops(output.hop_seconds);
  }
  if (applied.worker_lost) return lose_worker(self, "its worker answered another step");
  const auto early = state.early_outputs.find(state.core->step_in_flight_id());
  if (early != state.early_outputs.end()) {
    auto next = std::move(early->second);
    state.early_outputs.erase(early);
    return on_output(self, next.output, next.round_trip_seconds);
  }
  maybe_step(self);
}

// A step's output: applied now when its step is the oldest in flight, else held until the
// steps before it are (a pipeline's stages run them in order).
void on_answer(Self self, std::uint64_t step_id, engine::StepOutput output,
               double round_trip_seconds) {
  auto& state = self->state;
  if (!state.core->in_flight(step_id)) return;  // its worker was lost
  if (remote(self) && output.failed && output.error.fatal) {
    return lose_worker(self, output.error.message);
  }
  if (state.core->step_in_flight_id() != step_id) {
    state.early_outputs[step_id] = {std::move(output), round_trip_seconds};
    return;
  }
  on_output(self, output, round_trip_seconds);
}

// A LoRA adapter in slot `slot` of this replica: kept in the spec (a worker that replaces
// this one loads it too), the slot's cached prefixes forgotten, and put in the worker's
// slot now when it has one (its steps run in order, so between two of them).
caf::result<std::string> set_lora(Self self, std::int32_t slot, const std::string& path) {
  auto& state = self->state;
  if (slot < 1) return std::string("LoRA adapter slot " + std::to_string(slot) + " is not one");
  auto& paths = state.setup.spec.lora_adapters;
  if (paths.size() < static_cast<std::size_t>(slot)) paths.resize(static_cast<std::size_t>(slot));
  paths[static_cast<std::size_t>(slot - 1)] = path;
  ++state.lora_changes;
  state.core->forget_adapter(slot);
  if (!state.worker_ready || !state.worker) return std::string();
  auto rp = self->make_response_promise<std::string>();
  self->request(state.worker, kLoadTimeout, lora_atom::value, slot, path)
      .then([rp](const std::string& error) mutable { rp.deliver(error); },
            [self, rp](const caf::error& e) mutable {
              rp.deliver("the worker did not answer: " + self->system().render(e));
            });
  return rp;
}

}  // namespace

void maybe_step(Self self) {
  auto& state = self->state;
  if (!state.worker_ready || check_drained(self)) return;
  // A drain past its timeout lets the steps in flight finish and sends no more.
  if (state.draining && state.drain_expired) return;
  if (!state.worker) {
    // A local worker could not be made: the next step's work asks again.
    if (state.core->scheduler().has_unfinished()) {
      state.worker_ready = false;
      supply_worker(self);
    }
    return;
  }
  // A pipelined replica sends its next step while the earlier ones run (each stage runs
  // them in order, the steps' sequences disjoint).
  while (auto work = state.core->next_step()) {
    const std::uint64_t step_id = work->step_id;
    const auto sent = std::chrono::steady_clock::now();
    self->request(state.worker, state.setup.step_timeout, step_atom::value, std::move(*work))
        .then(
            [self, step_id, sent](engine::StepOutput& output) {
              on_answer(
                  self, step_id, std::move(output),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count());
            },
            [self, step_id](const caf::error& err) {
              if (!self->state.core->in_flight(step_id)) return;
              const std::string why = "the worker stopped: " + self->system().render(err);
              if (remote(self)) return lose_worker(self, why);
              // A new local worker takes over, and every step in flight is lost with the old
              // one: their requests resume on it.
              on_output(self, engine::failed_step(self->state.core->step_in_flight_id(),
                                                  {ErrorCode::internal, why, true}));
            });
  }
}

replica_actor::behavior_type scheduler(Self self, ReplicaSetup setup) {
  auto& state = self->state;
  state.core = std::make_unique<engine::EngineCore>(setup.config, setup.end_of_generation,
                                                    setup.token_budget);
  state.core->calibrate(setup.first.report.step_costs);
  state.worker = std::move(setup.first.worker);
  state.nodes = std::move(setup.first.nodes);
  state.parts = setup.first.report.parts;
  state.setup = std::move(setup);
  state.observer = std::make_unique<StepObserver>(state.setup.index, state.setup.metrics,
                                                  state.setup.step_events);
  state.observer->on_ready(true);
  // A node that dies or is cut off: its worker's proxy goes down at once. A local worker
  // (or group) that ends under a step: the step fails, and a new one takes over.
  self->monitor(state.worker);
  self->set_down_handler([self](const caf::down_msg& down) {
    auto& state = self->state;
    if (state.router && down.source == state.router.address()) {
      state.router = nullptr;  // shutting down: what it would have taken back ends here
      return;
    }
    if (!state.worker || down.source != state.worker.address()) return;
    const std::string reason = self->system().render(down.reason);
    if (remote(self)) return lose_worker(self, "its node is gone (" + reason + ")");
    const std::uint64_t step_id = state.core->step_in_flight_id();
    if (step_id == 0) return;  // between steps: the next step's request fails instead
    on_output(self, engine::failed_step(
                        step_id, {ErrorCode::internal, "the worker stopped: " + reason, true}));
  });
  // On shutdown every open request hears of it, so that none waits forever.
  self->set_exit_handler([self](const caf::exit_msg& msg) {
    auto ended = self->state.core->end_all(FinishReason::abort, "the engine is shutting down");
    deliver_all(self, ended);
    if (self->state.worker_ready) set_ready(self, false);
    retire_worker(self);
    self->quit(msg.reason);
  });
  return {
      [self](submit_atom, Submission& s) {
        auto& state = self->state;
        ++state.num_received;
        if (remote(self) && !takes_requests(self)) {
          // Routed here as its worker was lost, or as its node began to drain: it moves on
          // rather than wait for a node (the router ends it when no replica is up).
          return hand_back(self, std::move(s), "its worker was lost");
        }
        const RequestId id = s.id;
        const request_actor requester = s.requester;
        auto added = state.core->add({id, std::move(s.prompt), std::move(s.params), s.priority,
                                      requester, s.adapter, std::move(s.resumed)});
        if (!added) {
          self->send(requester, token_atom::value,
                     end_of(id, FinishReason::error, added.error().message));
          return;
        }
        maybe_step(self);
      },
      [self](abort_atom, RequestId id, FinishReason reason) {
        // Blocks are free before the next step is planned.
        auto event = self->state.core->cancel(id, reason);
        if (!event) return;
        self->state.observer->on_cancel(id, reason);
        deliver(self, *event);
        check_drained(self);
      },
      [self](drain_atom, const std::string& node, std::int64_t timeout_ms) {
        start_drain(self, node, timeout_ms);
      },
      [self](timeout_atom, std::uint64_t drain) { drain_timed_out(self, drain); },
      [self](supplied_atom, SupplyNews& news) { on_supplied(self, news); },
      [self](stats_atom) -> EngineStats { return self->state.core->stats(); },
      [self](replicas_atom) -> std::vector<ReplicaStats> {
        const auto& state = self->state;
        ReplicaStats alone;
        alone.index = state.setup.index;
        alone.up = takes_requests(self);
        // Down: a new worker loads (on its new node), or the replica waits for a node.
        alone.state = state.leaving                         ? "leaving"
                      : state.draining                      ? "draining"
                      : state.worker_ready                  ? "up"
                      : remote(self) && state.nodes.empty() ? "waiting"
                                                            : "loading";
        alone.node = cluster::node_label(state.nodes);
        alone.stats = state.core->stats();
        alone.workers = state.parts;
        for (std::size_t i = 0; i < alone.workers.size() && i < state.nodes.size(); ++i) {
          alone.workers[i].node = state.nodes[i];
        }
        return {alone};
      },
      [self](probe_atom, const std::vector<TokenId>& prompt, std::int32_t adapter) -> ReplicaProbe {
        const engine::Scheduler& s = self->state.core->scheduler();
        return {takes_requests(self),
                static_cast<std::int32_t>(s.num_waiting()),
                static_cast<std::int32_t>(s.num_running()),
                s.kv_cache().usage(),
                s.kv_cache().cached_prefix_tokens(prompt, adapter),
                self->state.num_received};
      },
      [self](lora_atom, std::int32_t slot, const std::string& path) -> caf::result<std::string> {
        return set_lora(self, slot, path);
      },
      [self](router_atom, const front_actor& router) {
        self->state.router = router;
        self->monitor(router);
      },
  };
}

}  // namespace troupe::actors
