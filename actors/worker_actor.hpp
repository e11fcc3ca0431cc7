// The worker actor: a shell around worker::Worker. It is spawned empty, loads when
// the scheduler sends it a spec, and then runs steps on its own thread (spawned
// detached: never on the actor system's threads).
#pragma once

#include <functional>
#include <memory>

#include "actors/messages.hpp"
#include "worker/worker.hpp"

namespace troupe::actors {

struct WorkerState {
  std::unique_ptr<worker::Worker> worker;
  std::function<void()> before_step;  // tests only
  static inline const char* name = "troupe.worker";
};

worker_actor::behavior_type worker(worker_actor::stateful_pointer<WorkerState> self,
                                   std::function<void()> before_step);

}  // namespace troupe::actors
