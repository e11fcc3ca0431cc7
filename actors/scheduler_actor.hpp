// The scheduler actor: a thin shell around engine::Scheduler that runs the
// iteration loop. One step is in flight at a time; while it runs, submissions
// and aborts are taken in, and the next plan is made when it returns.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "actors/messages.hpp"
#include "actors/worker_actor.hpp"
#include "engine/scheduler.hpp"
#include "monitoring/metrics.hpp"

namespace troupe::actors {

struct ActiveRequest {
  request_actor requester;
  SamplingParams params;
  std::vector<TokenId> prompt;
  bool known_to_worker = false;
  std::chrono::steady_clock::time_point submitted;
  std::chrono::steady_clock::time_point first_scheduled;
};

struct SchedulerState {
  std::unique_ptr<engine::Scheduler> scheduler;
  worker_actor worker;
  WorkerFactory make_worker;
  std::function<void()> before_step;
  std::unordered_map<RequestId, ActiveRequest> requests;
  std::vector<std::uint64_t> removed;  // to tell the worker with the next step
  bool step_in_flight = false;
  EngineStats stats;
  std::shared_ptr<monitoring::Metrics> metrics;
  std::int64_t reported_preemptions = 0;  // what the metrics have seen already
  std::int64_t reported_queried = 0, reported_hits = 0;
  static inline const char* name = "troupe.scheduler";
};

// `first_worker`: resources already made (so that model errors surface before
// the engine starts); later workers come from `make_worker`.
scheduler_actor::behavior_type scheduler(
    scheduler_actor::stateful_pointer<SchedulerState> self, engine::SchedulerConfig config,
    std::shared_ptr<std::unique_ptr<WorkerResources>> first_worker, WorkerFactory make_worker,
    std::function<void()> before_step, std::shared_ptr<monitoring::Metrics> metrics);

}  // namespace troupe::actors
