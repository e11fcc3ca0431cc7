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

}  // namespace troupe::actors
