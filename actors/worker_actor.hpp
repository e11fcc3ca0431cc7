// The worker actor: a shell around worker::Worker. It is spawned empty, loads when
// the scheduler (or its group) sends it a spec, and then runs steps on its own thread
// (spawned detached: never on the actor system's threads). A rank of a tensor-parallel
// group meets the others through its group's rendezvous store, over messages.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "actors/messages.hpp"
#include "worker/worker.hpp"

namespace troupe::actors {

struct WorkerState {
  std::unique_ptr<worker::Worker> worker;
  std::function<void()> before_step;  // tests only
  std::string collective_host;        // where the other ranks of its group reach it
  static inline const char* name = "troupe.worker";
};

// `collective_host`: this machine's address as the other ranks of a group see it
// (127.0.0.1 on one machine; a node's address toward the head across machines).
worker_actor::behavior_type worker(worker_actor::stateful_pointer<WorkerState> self,
                                   std::function<void()> before_step, std::string collective_host);

// Loads `worker` and waits, from a thread that is no actor's, for its report: or why there
// is none (its load failed, it did not answer within `timeout`, or it went away meanwhile,
// as a node killed while it loads: noticed when it goes, not at the timeout).
Result<engine::LoadReport> load_and_wait(caf::actor_system& system, const worker_actor& worker,
                                         const engine::WorkerSpec& spec, caf::duration timeout);

}  // namespace troupe::actors
