// The scheduler actor: a shell around engine::EngineCore. One step is in flight at a
// time; while it runs, submissions and aborts are taken in, and the next step is
// planned when it returns. A worker whose step threw is replaced by a fresh one
// loaded from the same spec.
#pragma once

#include <functional>
#include <memory>

#include "actors/messages.hpp"
#include "engine/engine_core.hpp"
#include "monitoring/metrics.hpp"

namespace troupe::actors {

struct SchedulerState {
  std::unique_ptr<engine::EngineCore> core;
  worker_actor worker;
  engine::WorkerSpec spec;            // for a replacement worker
  std::function<void()> before_step;  // tests only: handed to every worker
  bool worker_ready = true;           // false while a replacement loads
  double step_seconds = 0.0;          // in the worker
  double schedule_seconds = 0.0;      // in the loop's own logic
  std::shared_ptr<monitoring::Metrics> metrics;
  static inline const char* name = "troupe.scheduler";
};

// `worker` has loaded `spec` already; `config` is sized from its load report.
replica_actor::behavior_type scheduler(replica_actor::stateful_pointer<SchedulerState> self,
                                       engine::SchedulerConfig config,
                                       std::vector<TokenId> end_of_generation, worker_actor worker,
                                       engine::WorkerSpec spec, std::function<void()> before_step,
                                       std::shared_ptr<monitoring::Metrics> metrics);

}  // namespace troupe::actors
