#include "monitoring/metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

namespace troupe::monitoring {

namespace p = prometheus;

namespace {

// Latency buckets from 1 ms to 2 minutes.
p::Histogram::BucketBoundaries latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120};
}

p::Counter& counter(p::Registry& r, const char* name, const char* help) {
  return p::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

p::Gauge& gauge(p::Registry& r, const char* name, const char* help) {
  return p::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

p::Histogram& histogram(p::Registry& r, const char* name, const char* help,
                        p::Histogram::BucketBoundaries buckets) {
  return p::BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(buckets));
}

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<p::Registry> registry = std::make_shared<p::Registry>();
  // Each replica's last state and the totals its counters have taken in so far.
  struct Replica {
    std::int64_t running = 0, waiting = 0, blocks = 0;
    double kv_usage = 0.0;
    std::int64_t reported_preemptions = 0, reported_queried = 0, reported_hits = 0;
  };
  std::mutex mutex;
  std::map<std::int32_t, Replica> replicas;
  // The whole engine (every replica summed) ...
  p::Gauge& running =
      gauge(*registry, "troupe_num_requests_running", "Requests running (holding KV blocks)");
  p::Gauge& waiting =
      gauge(*registry, "troupe_num_requests_waiting", "Requests waiting to be scheduled");
  p::Gauge& kv_usage = gauge(*registry, "troupe_kv_cache_usage_ratio",
                             "Fraction of KV-cache blocks held by requests");
  // ... and each replica.
  p::Family<p::Gauge>& replica_running = p::BuildGauge()
                                             .Name("troupe_replica_num_requests_running")
                                             .Help("Requests running, by replica")
                                             .Register(*registry);
  p::Family<p::Gauge>& replica_waiting = p::BuildGauge()
                                             .Name("troupe_replica_num_requests_waiting")
                                             .Help("Requests waiting, by replica")
                                             .Register(*registry);
  p::Family<p::Gauge>& replica_kv_usage = p::BuildGauge()
                                              .Name("troupe_replica_kv_cache_usage_ratio")
                                              .Help("Fraction of KV-cache blocks held, by replica")
                                              .Register(*registry);
  p::Family<p::Gauge>& replica_up = p::BuildGauge()
                                        .Name("troupe_replica_up")
                                        .Help("1 while a replica has a worker, by replica")
                                        .Register(*registry);
  p::Family<p::Counter>& replica_losses = p::BuildCounter()
                                              .Name("troupe_replica_losses_total")
                                              .Help("Workers a replica lost, by replica")
                                              .Register(*registry);
  p::Counter& resubmitted =
      counter(*registry, "troupe_resubmitted_requests_total",
              "Requests moved unseen to another replica when theirs lost its worker");
  p::Gauge& nodes = gauge(*registry, "troupe_cluster_nodes", "Nodes joined to the head");
  p::Counter& node_joins = counter(*registry, "troupe_cluster_node_joins_total", "Node joins");
  p::Counter& prompt_tokens =
      counter(*registry, "troupe_prompt_tokens_total", "Prompt tokens computed");
  p::Counter& generation_tokens =
      counter(*registry, "troupe_generation_tokens_total", "Tokens generated");
  p::Counter& preemptions =
      counter(*registry, "troupe_num_preemptions_total", "Sequences preempted");
  p::Counter& prefix_queries = counter(*registry, "troupe_prefix_cache_queries_total",
                                       "Prompt tokens looked up in the prefix cache");
  p::Counter& prefix_hits = counter(*registry, "troupe_prefix_cache_hits_total",
                                    "Prompt tokens found in the prefix cache");
  p::Family<p::Counter>& outcomes = p::BuildCounter()
                                        .Name("troupe_request_success_total")
                                        .Help("Requests ended, by finish reason")
                                        .Register(*registry);
  p::Histogram& ttft = histogram(*registry, "troupe_time_to_first_token_seconds",
                                 "Time from submission to the first token", latency_buckets());
  p::Histogram& itl = histogram(*registry, "troupe_inter_token_latency_seconds",
                                "Time between two tokens of a request", latency_buckets());
  p::Histogram& tpot =
      histogram(*registry, "troupe_time_per_output_token_seconds",
                "Mean time per output token after the first, per request", latency_buckets());
  p::Histogram& e2e = histogram(*registry, "troupe_e2e_request_latency_seconds",
                                "Time from submission to the last token", latency_buckets());
  p::Histogram& queue =
      histogram(*registry, "troupe_request_queue_time_seconds",
                "Time from submission to the first scheduled step", latency_buckets());
  p::Histogram& prefill =
      histogram(*registry, "troupe_request_prefill_time_seconds",
                "Time from a request's first scheduled step to its first token", latency_buckets());
  p::Histogram& decode =
      histogram(*registry, "troupe_request_decode_time_seconds",
                "Time from a request's first token to its last", latency_buckets());
  p::Histogram& iteration = histogram(*registry, "troupe_iteration_duration_seconds",
                                      "Model step time (forward and sampling)", latency_buckets());
  p::Histogram& step_overhead = histogram(
      *registry, "troupe_step_overhead_seconds",
      "Per step, the round trip to the worker minus the worker's own time (messaging, network)",
      {0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1});
  p::Histogram& iteration_tokens =
      histogram(*registry, "troupe_iteration_tokens", "Tokens run through the model per iteration",
                {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192});
  p::Family<p::Counter>& http = p::BuildCounter()
                                    .Name("troupe_http_requests_total")
                                    .Help("HTTP requests answered, by route and status")
                                    .Register(*registry);
  p::Gauge& connections =
      gauge(*registry, "troupe_http_connections", "Open HTTP and WebSocket connections");
  p::Gauge& requests_in_flight =
      gauge(*registry, "troupe_http_requests_in_flight",
            "Generation requests admitted and not yet ended in the engine");
  p::Gauge& live_actors =
      gauge(*registry, "troupe_live_actors", "Actors alive in the engine's actor system");
  p::Family<p::Counter>& connection_errors =
      p::BuildCounter()
          .Name("troupe_http_connection_errors_total")
          .Help("Connections the server ended on its own, by reason")
          .Register(*registry);
  p::Counter& accept_errors = counter(*registry, "troupe_http_accept_errors_total",
                                      "Failed accepts (retried after a short backoff)");
};

Metrics::Metrics() : impl_(std::make_unique<Impl>()) {}
Metrics::~Metrics() = default;

std::string Metrics::serialize() const {
  std::ostringstream out;
  p::TextSerializer().Serialize(out, impl_->registry->Collect());
  return out.str();
}

void Metrics::record_iteration(const Iteration& it) {
  auto& m = *impl_;
  m.iteration.Observe(it.seconds);
  m.step_overhead.Observe(std::max(0.0, it.round_trip_seconds - it.seconds));
  m.iteration_tokens.Observe(static_cast<double>(it.num_tokens));
  auto add = [](p::Counter& counter, std::int64_t n) {
    if (n > 0) counter.Increment(static_cast<double>(n));
  };
  add(m.prompt_tokens, it.num_prompt_tokens);
  add(m.generation_tokens, it.num_generated);
  {
    std::lock_guard lock(m.mutex);
    auto& r = m.replicas[it.replica];
    add(m.preemptions,
        it.preemptions_total - std::exchange(r.reported_preemptions, it.preemptions_total));
    add(m.prefix_queries,
        it.prefix_queried_total - std::exchange(r.reported_queried, it.prefix_queried_total));
    add(m.prefix_hits, it.prefix_hits_total - std::exchange(r.reported_hits, it.prefix_hits_total));
  }
  set_replica_load(it.replica, it.num_running, it.num_waiting, it.kv_usage, it.num_kv_blocks);
}

void Metrics::set_replica_load(std::int32_t replica, std::int64_t num_running,
                               std::int64_t num_waiting, double kv_usage,
                               std::int32_t num_kv_blocks) {
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  auto& r = m.replicas[replica];
  r.running = num_running;
  r.waiting = num_waiting;
  r.kv_usage = kv_usage;
  r.blocks = num_kv_blocks;
  const p::Labels label{{"replica", std::to_string(replica)}};
  m.replica_running.Add(label).Set(static_cast<double>(r.running));
  m.replica_waiting.Add(label).Set(static_cast<double>(r.waiting));
  m.replica_kv_usage.Add(label).Set(r.kv_usage);
  std::int64_t running = 0, waiting = 0, blocks = 0;
  double held = 0.0, usage_sum = 0.0;
  for (const auto& [index, each] : m.replicas) {
    running += each.running;
    waiting += each.waiting;
    blocks += each.blocks;
    held += each.kv_usage * static_cast<double>(each.blocks);
    usage_sum += each.kv_usage;
  }
  m.running.Set(static_cast<double>(running));
  m.waiting.Set(static_cast<double>(waiting));
  // Over all blocks; a caller that gives no block counts gets the plain mean.
  m.kv_usage.Set(blocks > 0 ? held / static_cast<double>(blocks)
                            : usage_sum / static_cast<double>(m.replicas.size()));
}

void Metrics::set_replica_up(std::int32_t replica, bool up) {
  impl_->replica_up.Add({{"replica", std::to_string(replica)}}).Set(up ? 1.0 : 0.0);
}

void Metrics::record_replica_loss(std::int32_t replica, std::int64_t num_resubmitted) {
  impl_->replica_losses.Add({{"replica", std::to_string(replica)}}).Increment();
  if (num_resubmitted > 0) impl_->resubmitted.Increment(static_cast<double>(num_resubmitted));
}

void Metrics::record_node_join(std::int64_t num_nodes) {
  impl_->node_joins.Increment();
  impl_->nodes.Set(static_cast<double>(num_nodes));
}

void Metrics::set_num_nodes(std::int64_t num_nodes) {
  impl_->nodes.Set(static_cast<double>(num_nodes));
}

void Metrics::observe_queue_time(double seconds) {
  impl_->queue.Observe(seconds);
}

void Metrics::observe_request(std::string_view finish_reason, double e2e_seconds,
                              double ttft_seconds, double tpot_seconds, bool has_tokens) {
  impl_->outcomes.Add({{"finish_reason", std::string(finish_reason)}}).Increment();
  impl_->e2e.Observe(e2e_seconds);
  if (has_tokens) {
    impl_->ttft.Observe(ttft_seconds);
    impl_->tpot.Observe(tpot_seconds);
  }
}

void Metrics::observe_inter_token(double seconds) {
  impl_->itl.Observe(seconds);
}

void Metrics::observe_phases(double prefill_seconds, double decode_seconds) {
  impl_->prefill.Observe(prefill_seconds);
  impl_->decode.Observe(decode_seconds);
}

void Metrics::count_http(std::string_view route, int status) {
  impl_->http.Add({{"route", std::string(route)}, {"status", std::to_string(status)}}).Increment();
}

void Metrics::set_server_state(std::int64_t num_connections, std::int64_t num_requests_in_flight,
                               std::int64_t num_live_actors) {
  impl_->connections.Set(static_cast<double>(num_connections));
  impl_->requests_in_flight.Set(static_cast<double>(num_requests_in_flight));
  impl_->live_actors.Set(static_cast<double>(num_live_actors));
}

void Metrics::count_connection_error(std::string_view reason) {
  impl_->connection_errors.Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::count_accept_error() {
  impl_->accept_errors.Increment();
}

}  // namespace troupe::monitoring
