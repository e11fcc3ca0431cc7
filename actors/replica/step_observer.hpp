// What a replica's steps show outside it: the Prometheus metrics of each iteration, and
// the live page's step events (built only while someone watches). The scheduler actor
// tells it each applied step, each cancellation, and each change of its worker.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/engine_core.hpp"
#include "monitoring/metrics.hpp"
#include "monitoring/step_events.hpp"

namespace troupe::actors {

class StepObserver {
 public:
  StepObserver(std::int32_t replica, std::shared_ptr<monitoring::Metrics> metrics,
               std::shared_ptr<monitoring::StepEvents> step_events);

  // A step's output was applied: `round_trip_seconds` from its send to its answer.
  void on_step(const engine::EngineCore& core, const engine::AppliedStep& step,
               double round_trip_seconds);
  // A pipelined step's hops into its later stages (StepOutput::hop_seconds).
  void on_pipeline_hops(const std::vector<double>& seconds);
  // A request was cancelled between steps: the next step event lists it.
  void on_cancel(RequestId id, FinishReason reason);
  // The replica has a worker, or has none.
  void on_ready(bool up);
  // Its worker was lost; `handed_back` requests went to other replicas.
  void on_worker_lost(const engine::EngineCore& core, std::int64_t handed_back);
  // The replica left with its node (elastic): its series read 0 until its index returns.
  void on_left();
  // Requests that had started on a lost worker resume elsewhere (troupe_request_migrations_total).
  void on_migrated(std::int64_t num_requests);

 private:
  void record_metrics(const engine::EngineCore& core, const engine::AppliedStep& step,
                      double round_trip_seconds);
  void publish(const engine::EngineCore& core, const engine::AppliedStep& step,
               double round_trip_seconds);

  std::int32_t replica_;
  std::shared_ptr<monitoring::Metrics> metrics_;
  std::shared_ptr<monitoring::StepEvents> step_events_;
  // Requests cancelled since the last step, for its event (only while someone watches).
  std::vector<monitoring::StepEvent::Finished> cancelled_;
};

}  // namespace troupe::actors
