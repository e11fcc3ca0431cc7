#include "actors/replica/worker_keeping.hpp"
#include "monitoring/log.hpp"

#include <any>

namespace troupe::actors {

namespace {

const request_actor& requester_of(const std::any& reply_to) {
  return std::any_cast<const request_actor&>(reply_to);
}

}  // namespace

void deliver(SchedulerSelf self, engine::AddressedEvent& event) {
  self->send(requester_of(event.reply_to), token_atom::value,
             static_cast<engine::RequestEvent&&>(std::move(event)));
}

void deliver_all(SchedulerSelf self, std::vector<engine::AddressedEvent>& events) {
  for (auto& e : events) deliver(self, e);
}

bool remote(SchedulerSelf self) {
  return self->state.setup.source.registry != nullptr;
}

void set_ready(SchedulerSelf self, bool ready) {
  self->state.worker_ready = ready;
  count_up(self);
}

void count_up(SchedulerSelf self) {
  auto& state = self->state;
  const bool up = takes_requests(self);
  if (state.counted_up == up) return;
  state.counted_up = up;
  if (state.setup.replicas_up) *state.setup.replicas_up += up ? 1 : -1;
  state.observer->on_ready(up);
}

bool takes_requests(SchedulerSelf self) {
  return self->state.worker_ready && !self->state.draining;
}

// Stops the worker, which is no longer the replica's: whatever else comes of it (its down
// notice, a late answer) is stale.
void retire_worker(SchedulerSelf self) {
  auto& state = self->state;
  if (!state.worker) return;
  self->demonitor(state.worker.address());
  self->send_exit(state.worker, caf::exit_reason::kill);
  state.worker = nullptr;
  state.nodes.clear();
  state.parts.clear();
}

// Asks for a new worker; its news comes as supplied_atom messages.
void supply_worker(SchedulerSelf self) {
  auto& state = self->state;
  const std::uint64_t number = ++state.supply;
  state.supply_lora_changes = state.lora_changes;
  replica_actor me = caf::actor_cast<replica_actor>(self);
  actors::supply_worker(self->home_system(), state.setup.source, state.setup.spec,
                        /*retry=*/remote(self), number, self->address(), [me](SupplyNews news) {
                          caf::anon_send(me, supplied_atom::value, std::move(news));
                        });
}

// A request this replica cannot run (its worker is gone): another replica takes it,
// unseen by its caller, through the router; alone, it ends with `why`.
void hand_back(SchedulerSelf self, Submission s, const std::string& why) {
  s.moved = true;
  if (self->state.router) return self->send(self->state.router, submit_atom::value, std::move(s));
  self->send(s.requester, token_atom::value,
             end_of(s.id, FinishReason::error, "no replica is up: " + why));
}

void move_off(SchedulerSelf self, engine::EngineCore::LostWorker& lost, const std::string& why) {
  auto& state = self->state;
  deliver_all(self, lost.ended);
  for (auto& r : lost.unstarted) {
    hand_back(self,
              {r.id, std::move(r.prompt), std::move(r.params), r.priority, requester_of(r.reply_to),
               r.adapter, std::move(r.resumed)},
              why);
  }
  if (state.router) state.observer->on_migrated(lost.num_resumed);
}

// The worker is gone. A local one's KV is recomputed on its replacement; a remote one
// took its KV cache and samplers with it (a loss can be told twice: the first counts).
void lose_worker(SchedulerSelf self, const std::string& why) {
  auto& state = self->state;
  state.early_outputs.clear();  // of steps lost with the worker
  if (!remote(self)) {
    retire_worker(self);
    // Its requests resume on the replacement, with the tokens they sent.
    state.observer->on_migrated(state.core->reset_worker());
    state.worker_ready = false;  // still counted up: it is back in a moment
    return supply_worker(self);
  }
  if (!state.worker_ready) return;
  const std::string node = cluster::node_label(state.nodes);
  monitoring::logf(monitoring::LogLevel::warning, "replica %d lost its worker on node %s: %s",
                   state.setup.index, node.c_str(), why.c_str());
  retire_worker(self);
  state.draining = false;  // a drain cut short (its node went): the loss takes over
  state.draining_node.clear();
  set_ready(self, false);
  auto lost = state.core->lose_worker("replica " + std::to_string(state.setup.index) +
                                      " lost its node " + node + ": " + why);
  move_off(self, lost, why);
  state.observer->on_worker_lost(
      *state.core,
      state.router ? static_cast<std::int64_t>(lost.unstarted.size()) - lost.num_resumed : 0);
  if (state.setup.elastic) return leave(self, "its node " + node + " was lost");
  // The same KV cache as before: the scheduler's block count does not change.
  state.setup.spec.num_kv_blocks = state.core->scheduler().config().num_blocks;
  supply_worker(self);
}

void leave(SchedulerSelf self, const std::string& why) {
  auto& state = self->state;
  state.leaving = true;
  monitoring::logf(monitoring::LogLevel::info, "replica %d leaves (%s)", state.setup.index,
                   why.c_str());
  state.observer->on_left();
  self->send(state.setup.source.registry, cluster::retired_atom::value, state.setup.index);
  if (!state.router) return self->quit();
  // Whatever the router sent before its answer (a submission routed here a moment ago)
  // arrives first, and goes back to it: nothing is left here when this ends.
  self->request(caf::actor_cast<caf::actor>(state.router), caf::infinite, leave_atom::value,
                state.setup.index)
      .then([self](bool) { self->quit(); }, [self](const caf::error&) { self->quit(); });
}

void on_supplied(SchedulerSelf self, SupplyNews& news) {
  auto& state = self->state;
  if (news.number != state.supply) {
    if (news.worker) self->send_exit(news.worker, caf::exit_reason::kill);  // not wanted now
    return;
  }
  const std::string node = cluster::node_label(news.nodes);
  if (news.stage == SupplyNews::Stage::placed) {
    state.nodes = std::move(news.nodes);
    state.parts.clear();
  } else if (news.stage == SupplyNews::Stage::failed) {
    monitoring::logf(monitoring::LogLevel::warning, "replica %d has no worker: %s",
                     state.setup.index, news.error.message.c_str());
    if (remote(self)) return;
    // No local worker could be made: the open requests end with the reason; the next
    // request's step asks for another.
    auto ended = state.core->end_all(FinishReason::error, news.error.message);
    deliver_all(self, ended);
    state.worker_ready = true;
  } else {
    state.worker = std::move(news.worker);
    state.nodes = std::move(news.nodes);
    state.worker_wait = 0;  // in time: what waited for it resumes here
    state.parts = news.report.parts;
    self->monitor(state.worker);
    if (state.supply_lora_changes != state.lora_changes) {
      // LoRA slots changed while it loaded: it hears them before its first step (a
      // worker's messages run in order). A file it cannot read fails that slot's steps.
      const auto& paths = state.setup.spec.lora_adapters;
      for (std::size_t i = 0; i < paths.size(); ++i) {
        caf::anon_send(state.worker, lora_atom::value, static_cast<std::int32_t>(i + 1), paths[i]);
      }
    }
    state.core->calibrate(news.report.step_costs);
    if (!remote(self)) {
      state.worker_ready = true;
    } else {
      set_ready(self, true);
      // Said once it is so: a client that reads the line finds the replica up.
      monitoring::logf(monitoring::LogLevel::info, "replica %d is up again on node %s",
                       state.setup.index, node.c_str());
    }
    maybe_step(self);
  }
}

}  // namespace troupe::actors
