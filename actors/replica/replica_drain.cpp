#include "actors/replica/replica_drain.hpp"
#include "monitoring/log.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace troupe::actors {

namespace {

// The worker goes, the node is told, and a new worker is asked for elsewhere. What is
// still here (running at the timeout) moves with its tokens.
void finish_drain(SchedulerSelf self, const std::string& why) {
  auto& state = self->state;
  const std::string node = state.draining_node;
  // The same KV cache as before: the scheduler's block count does not change.
  state.setup.spec.num_kv_blocks = state.core->scheduler().config().num_blocks;
  if (!state.router) {
    // Alone (one replica), there is nowhere to move: what is left stays, and resumes with
    // its tokens on the next worker (a spare node, or this one back) if one loads within
    // the failover timeout; else it ends with an error then.
    const auto wait_s = std::chrono::duration<double>(state.setup.failover_timeout).count();
    monitoring::logf(monitoring::LogLevel::info,
                     "replica %d drained off node %s (%s; %zu request(s) wait up to %.0f s for "
                     "a new worker)",
                     state.setup.index, node.c_str(), why.c_str(), state.core->num_requests(),
                     wait_s);
    retire_worker(self);
    state.observer->on_migrated(state.core->reset_worker());
    state.draining = false;
    state.draining_node.clear();
    set_ready(self, false);
    self->send(state.setup.source.registry, drained_atom::value, state.setup.index, node);
    supply_worker(self);
    if (state.core->num_requests() == 0) return;
    state.worker_wait = ++state.drain_number;
    state.worker_wait_why =
        "replica " + std::to_string(state.setup.index) + " drained off node " + node;
    self->delayed_send(self, state.setup.failover_timeout, timeout_atom::value, state.worker_wait);
    return;
  }
  auto left = state.core->lose_worker("replica " + std::to_string(state.setup.index) +
                                      " drained off node " + node);
  monitoring::logf(monitoring::LogLevel::info,
                   "replica %d drained off node %s (%s; %zu request(s) moved)", state.setup.index,
                   node.c_str(), why.c_str(), left.unstarted.size());
  retire_worker(self);
  state.draining = false;
  state.draining_node.clear();
  set_ready(self, false);
  move_off(self, left, "its node " + node + " drained");
  self->send(state.setup.source.registry, drained_atom::value, state.setup.index, node);
  if (state.setup.elastic) return leave(self, "its node " + node + " drained");
  supply_worker(self);
}

// Alone, the requests a drain left waited the failover timeout for a new worker, and
// none loaded: they end with the error (each stream with its error event).
void worker_wait_over(SchedulerSelf self) {
  auto& state = self->state;
  state.worker_wait = 0;
  if (state.worker_ready) return;
  const auto wait_s = std::chrono::duration<double>(state.setup.failover_timeout).count();
  char why[96];
  std::snprintf(why, sizeof why, "; no node took it within %.0f s (--failover-timeout)", wait_s);
  auto ended =
      state.core->end_all(FinishReason::error, "no replica is up: " + state.worker_wait_why + why);
  monitoring::logf(monitoring::LogLevel::warning, "replica %d: %zu request(s) end: %s%s",
                   state.setup.index, ended.size(), state.worker_wait_why.c_str(), why);
  deliver_all(self, ended);
}

}  // namespace

void start_drain(SchedulerSelf self, const std::string& node, std::int64_t timeout_ms) {
  auto& state = self->state;
  const bool here = std::find(state.nodes.begin(), state.nodes.end(), node) != state.nodes.end();
  if (!remote(self) || state.draining) return;
  if (!here || !state.worker_ready || !state.worker) {
    // Not (or not yet) on that node: nothing of it runs there. A worker still loading
    // there is the supply's; the node's end sends it elsewhere.
    self->send(state.setup.source.registry, drained_atom::value, state.setup.index, node);
    return;
  }
  state.draining = true;
  state.drain_expired = false;
  state.draining_node = node;
  const std::uint64_t number = ++state.drain_number;
  count_up(self);
  // The queued requests move now (alone, nowhere: they run here); the running ones finish.
  engine::EngineCore::LostWorker queued;
  if (state.router) queued = state.core->take_waiting();
  monitoring::logf(monitoring::LogLevel::info,
                   "replica %d drains off node %s: %zu queued request(s) move, %zu running "
                   "finish (up to %lld ms)",
                   state.setup.index, node.c_str(), queued.unstarted.size(),
                   state.core->num_requests(), static_cast<long long>(timeout_ms));
  move_off(self, queued, "its node " + node + " drains");
  self->delayed_send(self, std::chrono::milliseconds(std::max<std::int64_t>(timeout_ms, 0)),
                     timeout_atom::value, number);
  check_drained(self);
}

bool check_drained(SchedulerSelf self) {
  const auto& state = self->state;
  // A step in flight is let finish: its tokens are sent before anything moves.
  if (!state.draining || state.core->step_in_flight()) return false;
  if (state.drain_expired) {
    finish_drain(self, "its timeout passed");
  } else if (state.core->num_requests() == 0) {
    finish_drain(self, "its requests finished");
  } else {
    return false;
  }
  return true;
}

void drain_timed_out(SchedulerSelf self, std::uint64_t number) {
  auto& state = self->state;
  if (number != 0 && number == state.worker_wait) return worker_wait_over(self);
  if (!state.draining || number != state.drain_number) return;
  state.drain_expired = true;
  check_drained(self);
}

}  // namespace troupe::actors
