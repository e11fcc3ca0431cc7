#include "actors/scheduler_actor.hpp"
#include "monitoring/log.hpp"

#include <any>
#include <cstdio>

#include "actors/cluster/group_actor.hpp"
#include "actors/worker_actor.hpp"

namespace troupe::actors {

namespace {

using Self = replica_actor::stateful_pointer<SchedulerState>;

const request_actor& requester_of(const std::any& reply_to) {
  return std::any_cast<const request_actor&>(reply_to);
}

void deliver(Self self, engine::RequestUpdate& u) {
  self->send(requester_of(u.reply_to), token_atom::value,
             static_cast<engine::RequestEvent&&>(std::move(u)));
}

void deliver_all(Self self, std::vector<engine::RequestUpdate>& updates) {
  for (auto& u : updates) deliver(self, u);
}

void record_metrics(Self self, const engine::AppliedStep& step, double round_trip_seconds) {
  auto& state = self->state;
  if (!state.setup.metrics) return;
  const EngineStats s = state.core->stats();
  // A draft's tokens are neither prompt nor (until accepted) generated tokens.
  monitoring::Metrics::Iteration it{state.setup.index,
                                    s.num_kv_blocks,
                                    step.worker_seconds,
                                    round_trip_seconds,
                                    step.num_tokens,
                                    step.num_tokens - step.num_decodes - step.plan.num_draft_tokens,
                                    static_cast<std::int64_t>(step.updates.size()),
                                    s.num_running,
                                    s.num_waiting,
                                    s.kv_usage,
                                    s.num_preemptions,
                                    s.prefix_queried_tokens,
                                    s.prefix_hit_tokens};
  it.spec_drafts_total = s.spec_num_drafts;
  it.spec_draft_tokens_total = s.spec_num_draft_tokens;
  it.spec_accepted_tokens_total = s.spec_num_accepted_tokens;
  it.spec_accepted_per_pos_total = s.spec_num_accepted_tokens_per_pos;
  state.setup.metrics->record_iteration(it);
}

// The step as the live page sees it; built only while someone watches.
void publish_step(Self self, const engine::AppliedStep& step, double round_trip_seconds) {
  auto& state = self->state;
  if (!state.setup.step_events || !state.setup.step_events->watched()) return;
  monitoring::StepEvent e;
  e.replica = state.setup.index;
  e.step = static_cast<std::uint64_t>(state.core->counters().num_steps);
  e.time_ms =
      std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  e.step_ms = step.worker_seconds * 1e3;
  e.round_trip_ms = round_trip_seconds * 1e3;
  e.batch.reserve(step.plan.chunks.size());
  std::size_t sampled = 0;
  for (const auto& chunk : step.plan.chunks) {
    // As the metrics count them: a decode is one token that samples (and its draft's).
    const bool decode = chunk.is_decode();
    const auto drafted = static_cast<std::int32_t>(chunk.draft.size());
    const std::int32_t accepted =
        chunk.samples && sampled < step.num_accepted.size() ? step.num_accepted[sampled] : 0;
    if (chunk.samples) ++sampled;
    e.batch.push_back({chunk.id, chunk.num_new_tokens, !decode, drafted, accepted});
    (decode ? e.num_decode_tokens : e.num_prefill_tokens) += chunk.num_new_tokens;
    e.num_drafted_tokens += drafted;
    e.num_accepted_tokens += accepted;
  }
  e.num_generated_tokens = step.num_generated;
  for (const auto& f : step.first_tokens) e.first_tokens.push_back({f.id, f.seconds * 1e3});
  e.finished = std::move(state.cancelled);
  state.cancelled.clear();
  for (const auto& u : step.updates) {
    if (u.finish_reason != FinishReason::none) {
      e.finished.push_back({u.id, finish_reason_name(u.finish_reason)});
    }
  }
  const EngineStats s = state.core->stats();
  e.num_running = s.num_running;
  e.num_waiting = s.num_waiting;
  e.kv_usage = s.kv_usage;
  e.num_kv_blocks = s.num_kv_blocks;
  e.prefix_hit_tokens = s.prefix_hit_tokens;
  e.prefix_queried_tokens = s.prefix_queried_tokens;
  e.num_preemptions = s.num_preemptions;
  state.setup.step_events->publish(e);
}

bool remote(Self self) {
  return self->state.setup.registry != nullptr;
}

void set_ready(Self self, bool ready) {
  auto& state = self->state;
  if (state.worker_ready == ready) return;
  state.worker_ready = ready;
  if (state.setup.replicas_up) *state.setup.replicas_up += ready ? 1 : -1;
  if (state.setup.metrics) state.setup.metrics->set_replica_up(state.setup.index, ready);
}

void maybe_step(Self self);
void place_worker(Self self);

// A request this replica cannot run (its worker is gone): another replica takes it,
// unseen by its caller, through the router; alone, it ends with `why`.
void hand_back(Self self, Submission s, const std::string& why) {
  if (self->state.router) {
    self->send(self->state.router, submit_atom::value, std::move(s));
  } else {
    self->send(s.requester, token_atom::value,
               end_of(s.id, FinishReason::error, "no replica is up: " + why));
  }
}

// A fresh local worker loads the same spec; steps wait for it. The lost KV is recomputed.
void replace_local_worker(Self self) {
  auto& state = self->state;
  self->demonitor(state.setup.worker.address());
  self->send_exit(state.setup.worker, caf::exit_reason::kill);
  state.core->reset_worker();
  state.worker_ready = false;
  state.setup.worker =
      cluster::spawn_local_worker(self->home_system(), state.setup.tensor_parallel_size,
                                  state.setup.before_step, state.setup.collective_timeout);
  self->monitor(state.setup.worker);
  auto give_up = [self](const std::string& why) {
    // No worker could be made: the open requests end with the reason; the next
    // request's step tries another worker.
    auto updates = self->state.core->end_all(FinishReason::error, why);
    deliver_all(self, updates);
    self->state.worker_ready = true;
  };
  self->request(state.setup.worker, caf::infinite, load_atom::value, state.setup.spec)
      .then(
          [self, give_up](const engine::LoadReport& report) {
            if (report.failed) return give_up(report.error.message);
            self->state.core->calibrate(report.step_costs);
            self->state.worker_ready = true;
            maybe_step(self);
          },
          [self, give_up](const caf::error& err) { give_up(self->system().render(err)); });
}

// Gives the remote worker up: it is stopped, and it is no longer the replica's, so that
// whatever else comes of it (its down notice after a failed step or load, a late answer)
// is stale. A loss can be told twice (a group answers its failed step, then ends): only
// the first is acted on.
void retire_worker(Self self) {
  auto& state = self->state;
  if (!state.setup.worker) return;
  self->demonitor(state.setup.worker.address());
  self->send_exit(state.setup.worker, caf::exit_reason::kill);
  state.setup.worker = nullptr;
  state.setup.node.clear();
  state.setup.nodes.clear();
}

// The remote worker is gone, and its KV cache and samplers with it.
void lose_remote_worker(Self self, const std::string& why) {
  auto& state = self->state;
  if (!state.worker_ready) return;  // already lost
  monitoring::logf(monitoring::LogLevel::warning, "replica %d lost its worker on node %s: %s",
                   state.setup.index, state.setup.node.c_str(), why.c_str());
  const std::string lost_node = state.setup.node;
  retire_worker(self);
  set_ready(self, false);
  auto lost = state.core->lose_worker("replica " + std::to_string(state.setup.index) +
                                      " lost its node " + lost_node + ": " + why);
  deliver_all(self, lost.ended);
  for (auto& r : lost.unstarted) {
    hand_back(self,
              {r.id, std::move(r.prompt), std::move(r.params), r.priority, requester_of(r.reply_to),
               r.adapter},
              why);
  }
  if (state.setup.metrics) {
    const EngineStats now = state.core->stats();
    state.setup.metrics->set_replica_load(state.setup.index, now.num_running, now.num_waiting,
                                          now.kv_usage, now.num_kv_blocks);
    state.setup.metrics->record_replica_loss(
        state.setup.index, state.router ? static_cast<std::int64_t>(lost.unstarted.size()) : 0);
  }
  place_worker(self);
}

// The node no replica should be placed on again after a failed load: the failing rank's.
const std::string& failed_node(Self self, const engine::LoadReport& report) {
  const auto& nodes = self->state.setup.nodes;
  const auto rank = static_cast<std::size_t>(std::max(report.failed_rank, 0));
  return nodes.at(std::min(rank, nodes.size() - 1));
}

// Asks the registry for workers on nodes; the replica is down until they have loaded.
void place_worker(Self self) {
  auto& state = self->state;
  // One placement at a time, and only for a replica without a worker: every worker the
  // head spawns is in use or stopped.
  if (state.placing || state.setup.worker) return;
  state.placing = true;
  // The same KV cache as before: the scheduler's block count does not change.
  state.setup.spec.num_kv_blocks = state.core->scheduler().config().num_blocks;
  self->request(state.setup.registry, caf::infinite, cluster::place_atom::value, state.setup.index,
                state.setup.tensor_parallel_size)
      .then(
          [self](cluster::Placement& placed) {
            auto& state = self->state;
            state.placing = false;
            if (state.setup.worker) {
              // (Not reached: a replica with a worker asks for none.) Not left running.
              for (const auto& w : placed.workers) self->send_exit(w, caf::exit_reason::kill);
              return;
            }
            state.setup.nodes = placed.nodes;
            state.setup.node = cluster::node_label(placed.nodes);
            state.setup.worker = cluster::worker_for(self->home_system(), std::move(placed),
                                                     state.setup.collective_timeout);
            self->monitor(state.setup.worker);
            // Answers about a worker that was lost meanwhile (and replaced) are stale.
            const caf::actor_addr loading = state.setup.worker.address();
            self->request(state.setup.worker, kGroupLoadTimeout, load_atom::value, state.setup.spec)
                .then(
                    [self, loading](const engine::LoadReport& report) {
                      auto& state = self->state;
                      if (state.setup.worker.address() != loading) return;
                      if (report.failed) {
                        monitoring::logf(monitoring::LogLevel::warning,
                                         "replica %d cannot load on node %s: %s", state.setup.index,
                                         state.setup.node.c_str(), report.error.message.c_str());
                        // That node will not do: the replica waits for another.
                        self->send(state.setup.registry, cluster::unfit_atom::value,
                                   failed_node(self, report), report.error.message);
                        retire_worker(self);
                        place_worker(self);
                        return;
                      }
                      state.core->calibrate(report.step_costs);
                      set_ready(self, true);
                      // Said once it is so: a client that reads the line finds the replica
                      // up (before, a request sent at the line could get 503).
                      monitoring::logf(monitoring::LogLevel::info,
                                       "replica %d is up again on node %s", state.setup.index,
                                       state.setup.node.c_str());
                      maybe_step(self);
                    },
                    [self, loading](const caf::error& err) {
                      auto& state = self->state;
                      if (state.setup.worker.address() != loading) return;
                      const std::string why = self->system().render(err);
                      monitoring::logf(monitoring::LogLevel::warning,
                                       "replica %d: its new worker did not load: %s",
                                       state.setup.index, why.c_str());
                      // Not that node again (a dead one is dropped anyway): another, when
                      // one is free. A group's failing node is not known here: all stay.
                      if (state.setup.nodes.size() == 1) {
                        self->send(state.setup.registry, cluster::unfit_atom::value,
                                   state.setup.node, "its worker did not load: " + why);
                      }
                      retire_worker(self);
                      place_worker(self);
                    });
          },
          [self](const caf::error& err) {
            self->state.placing = false;
            monitoring::logf(monitoring::LogLevel::warning, "replica %d cannot be placed: %s",
                             self->state.setup.index, self->system().render(err).c_str());
          });
}

void on_output(Self self, const engine::StepOutput& output, double round_trip_seconds = 0.0) {
  auto applied = self->state.core->apply(output);
  deliver_all(self, applied.updates);
  if (!output.failed) {
    record_metrics(self, applied, round_trip_seconds);
    publish_step(self, applied, round_trip_seconds);
  }
  if (applied.worker_lost) {
    if (remote(self)) return lose_remote_worker(self, "its worker answered another step");
    replace_local_worker(self);
  }
  maybe_step(self);
}

// Plans and sends the next step, unless one is in flight or nothing can run.
void maybe_step(Self self) {
  auto& state = self->state;
  if (!state.worker_ready) return;
  auto work = state.core->next_step();
  if (!work) return;
  const std::uint64_t step_id = work->step_id;
  const auto sent = std::chrono::steady_clock::now();
  self->request(state.setup.worker, state.setup.step_timeout, step_atom::value, std::move(*work))
      .then(
          [self, step_id, sent](const engine::StepOutput& output) {
            if (self->state.core->step_in_flight_id() != step_id) return;  // its worker was lost
            if (remote(self) && output.failed && output.error.fatal) {
              return lose_remote_worker(self, output.error.message);
            }
            on_output(
                self, output,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count());
          },
          [self, step_id](const caf::error& err) {
            if (self->state.core->step_in_flight_id() != step_id) return;
            const std::string why = "the worker stopped: " + self->system().render(err);
            if (remote(self)) return lose_remote_worker(self, why);
            // A new local worker takes over; this step's requests fail.
            on_output(self, engine::failed_step(step_id, {ErrorCode::internal, why, true}));
          });
}

}  // namespace

replica_actor::behavior_type scheduler(Self self, ReplicaSetup setup) {
  auto& state = self->state;
  state.core = std::make_unique<engine::EngineCore>(setup.config, setup.end_of_generation,
                                                    setup.token_budget);
  state.core->calibrate(setup.step_costs);
  state.setup = std::move(setup);
  if (state.setup.metrics) state.setup.metrics->set_replica_up(state.setup.index, true);
  // A node that dies or is cut off: its worker's proxy goes down at once. A local worker
  // (or group) that ends under a step: the step fails, and a new one takes over.
  self->monitor(state.setup.worker);
  self->set_down_handler([self](const caf::down_msg& down) {
    auto& state = self->state;
    if (state.router && down.source == state.router.address()) {
      // Shutting down: what it would have taken back now ends here.
      state.router = nullptr;
      return;
    }
    if (!state.setup.worker || down.source != state.setup.worker.address()) return;
    if (!remote(self)) {
      const std::uint64_t step_id = state.core->step_in_flight_id();
      if (step_id == 0) return;  // between steps: the next step's request fails instead
      const std::string why = "the worker stopped: " + self->system().render(down.reason);
      return on_output(self, engine::failed_step(step_id, {ErrorCode::internal, why, true}));
    }
    const std::string why = "its node is gone (" + self->system().render(down.reason) + ")";
    if (state.worker_ready) return lose_remote_worker(self, why);
    // Lost while it loaded: another node, at once (the load's answer would come only at
    // its timeout, and is ignored as stale).
    monitoring::logf(monitoring::LogLevel::warning,
                     "replica %d: the node %s went while its worker loaded: %s", state.setup.index,
                     state.setup.node.c_str(), why.c_str());
    retire_worker(self);
    place_worker(self);
  });
  // On shutdown every open request hears of it, so that none waits forever.
  self->set_exit_handler([self](const caf::exit_msg& msg) {
    auto updates = self->state.core->end_all(FinishReason::abort, "the engine is shutting down");
    deliver_all(self, updates);
    if (self->state.worker_ready) set_ready(self, false);
    if (self->state.setup.worker) self->send_exit(self->state.setup.worker, caf::exit_reason::kill);
    self->quit(msg.reason);
  });
  return {
      [self](submit_atom, Submission& s) {
        auto& state = self->state;
        ++state.num_received;
        if (remote(self) && !state.worker_ready) {
          // Routed here as its worker was lost: it moves on rather than wait for a node
          // (the router ends it when no replica is up).
          return hand_back(self, std::move(s), "its worker was lost");
        }
        const RequestId id = s.id;
        const request_actor requester = s.requester;
        auto added = self->state.core->add(
            {id, std::move(s.prompt), std::move(s.params), s.priority, requester, s.adapter});
        if (!added) {
          self->send(requester, token_atom::value,
                     end_of(id, FinishReason::error, added.error().message));
          return;
        }
        maybe_step(self);
      },
      [self](abort_atom, RequestId id, FinishReason reason) {
        // Blocks are free before the next step is planned.
        auto update = self->state.core->cancel(id, reason);
        if (!update) return;
        const auto& events = self->state.setup.step_events;
        if (events && events->watched()) {
          self->state.cancelled.push_back({id, finish_reason_name(reason)});
        }
        deliver(self, *update);
      },
      [self](stats_atom) -> EngineStats { return self->state.core->stats(); },
      [self](replicas_atom) -> std::vector<ReplicaStats> {
        ReplicaStats alone;
        alone.index = self->state.setup.index;
        const auto& state = self->state;
        alone.up = state.worker_ready;
        // Down: a new worker loads (on its new node), or the replica waits for a node.
        alone.state = state.worker_ready ? "up" : state.placing ? "waiting" : "loading";
        alone.node = state.setup.node;
        alone.stats = self->state.core->stats();
        return {alone};
      },
      [self](probe_atom, const std::vector<TokenId>& prompt) -> ReplicaProbe {
        const engine::Scheduler& s = self->state.core->scheduler();
        return {self->state.worker_ready,
                static_cast<std::int32_t>(s.num_waiting()),
                static_cast<std::int32_t>(s.num_running()),
                s.kv_cache().usage(),
                s.kv_cache().cached_prefix_tokens(prompt),
                self->state.num_received};
      },
      [self](router_atom, const scheduler_actor& router) {
        self->state.router = router;
        self->monitor(router);
      },
  };
}

}  // namespace troupe::actors
