#include "actors/replica/step_observer.hpp"

#include <chrono>

namespace troupe::actors {

StepObserver::StepObserver(std::int32_t replica, std::shared_ptr<monitoring::Metrics> metrics,
                           std::shared_ptr<monitoring::StepEvents> step_events)
    : replica_(replica), metrics_(std::move(metrics)), step_events_(std::move(step_events)) {}

void StepObserver::on_step(const engine::EngineCore& core, const engine::AppliedStep& step,
                           double round_trip_seconds) {
  record_metrics(core, step, round_trip_seconds);
  publish(core, step, round_trip_seconds);
}

void StepObserver::on_pipeline_hops(const std::vector<double>& seconds) {
  if (metrics_ && !seconds.empty()) metrics_->record_pipeline_hops(seconds);
}

void StepObserver::on_cancel(RequestId id, FinishReason reason) {
  if (step_events_ && step_events_->watched()) {
    cancelled_.push_back({id, finish_reason_name(reason)});
  }
}

void StepObserver::on_ready(bool up) {
  if (metrics_) metrics_->set_replica_up(replica_, up);
}

void StepObserver::on_worker_lost(const engine::EngineCore& core, std::int64_t handed_back) {
  if (!metrics_) return;
  const EngineStats now = core.stats();
  metrics_->set_replica_load(replica_, now.num_running, now.num_waiting, now.kv_usage,
                             now.num_kv_blocks);
  metrics_->record_replica_loss(replica_, handed_back);
}

void StepObserver::on_left() {
  if (!metrics_) return;
  metrics_->replica_left(replica_);
}

void StepObserver::on_migrated(std::int64_t num_requests) {
  if (metrics_ && num_requests > 0) metrics_->record_migrations(num_requests);
}

void StepObserver::record_metrics(const engine::EngineCore& core, const engine::AppliedStep& step,
                                  double round_trip_seconds) {
  if (!metrics_) return;
  const EngineStats s = core.stats();
  // A draft's tokens are neither prompt nor (until accepted) generated tokens.
  monitoring::Metrics::Iteration it{replica_,
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
  auto by_adapter = core.scheduler().adapter_counts();
  it.running_by_adapter = std::move(by_adapter.running);
  it.waiting_by_adapter = std::move(by_adapter.waiting);
  metrics_->record_iteration(it);
}

void StepObserver::publish(const engine::EngineCore& core, const engine::AppliedStep& step,
                           double round_trip_seconds) {
  if (!step_events_ || !step_events_->watched()) return;
  monitoring::StepEvent e;
  e.replica = replica_;
  e.step = static_cast<std::uint64_t>(core.counters().num_steps);
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
  e.finished = std::move(cancelled_);
  cancelled_.clear();
  for (const auto& u : step.updates) {
    if (u.finish_reason != FinishReason::none) {
      e.finished.push_back({u.id, finish_reason_name(u.finish_reason)});
    }
  }
  const EngineStats s = core.stats();
  e.num_running = s.num_running;
  e.num_waiting = s.num_waiting;
  e.kv_usage = s.kv_usage;
  e.num_kv_blocks = s.num_kv_blocks;
  e.prefix_hit_tokens = s.prefix_hit_tokens;
  e.prefix_queried_tokens = s.prefix_queried_tokens;
  e.num_preemptions = s.num_preemptions;
  step_events_->publish(e);
}

}  // namespace troupe::actors
