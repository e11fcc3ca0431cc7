#include "monitoring/metrics.hpp"

#include "monitoring/process_stats.hpp"
#include "troupe/sampling.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace troupe::monitoring {

namespace p = prometheus;

namespace {

// Latency buckets from 1 ms to 2 minutes.
p::Histogram::BucketBoundaries latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120};
}

// vLLM's request-length buckets (build_1_2_5_buckets), fixed up to a million tokens
// instead of up to max_model_len: the same boundaries whatever the model.
p::Histogram::BucketBoundaries token_count_buckets() {
  p::Histogram::BucketBoundaries buckets;
  for (double decade = 1; decade <= 1e6; decade *= 10) {
    for (double step : {1.0, 2.0, 5.0}) {
      if (decade * step <= 1e6) buckets.push_back(decade * step);
    }
  }
  return buckets;
}

}  // namespace

struct Metrics::Impl {
  Impl(std::string model_name, std::int32_t num_replicas)
      : model{{"model_name", std::move(model_name)}} {
    // The series known before their first event, at 0.
    for (const FinishReason reason : {FinishReason::stop, FinishReason::length, FinishReason::abort,
                                      FinishReason::timeout, FinishReason::error}) {
      outcomes.Add({{"finish_reason", std::string(finish_reason_name(reason))}});
    }
    for (const std::string_view reason : kConnectionErrorReasons) {
      connection_errors.Add({{"reason", std::string(reason)}});
    }
    for (std::int32_t replica = 0; replica < num_replicas; ++replica) {
      const p::Labels label{{"replica", std::to_string(replica)}};
      replica_running.Add(label);
      replica_waiting.Add(label);
      replica_kv_usage.Add(label);
      replica_up.Add(label);
      replica_losses.Add(label);
    }
    // A fixed count until the engine says otherwise (set_replica_count).
    replicas_now.Set(num_replicas);
    replicas_min.Set(num_replicas);
    replicas_max.Set(num_replicas);
  }

  // Every troupe_ family carries the served model's name, as vLLM labels every vllm:
  // metric: a dashboard selects by it, and two servers scraped together stay apart.
  const p::Labels model;
  std::shared_ptr<p::Registry> registry = std::make_shared<p::Registry>();

  p::Family<p::Counter>& counter_family(const char* name, const char* help) {
    return p::BuildCounter().Name(name).Help(help).Labels(model).Register(*registry);
  }
  p::Family<p::Gauge>& gauge_family(const char* name, const char* help) {
    return p::BuildGauge().Name(name).Help(help).Labels(model).Register(*registry);
  }
  p::Counter& counter(const char* name, const char* help) {
    return counter_family(name, help).Add({});
  }
  p::Gauge& gauge(const char* name, const char* help) { return gauge_family(name, help).Add({}); }
  void add_lora_families() {
    if (lora_running != nullptr) return;
    lora_running = &gauge_family("troupe_lora_requests_running",
                                 "Requests running (holding KV blocks), by LoRA adapter");
    lora_waiting = &gauge_family("troupe_lora_requests_waiting",
                                 "Requests waiting to be scheduled, by LoRA adapter");
  }
  p::Histogram& histogram(const char* name, const char* help,
                          p::Histogram::BucketBoundaries buckets) {
    return p::BuildHistogram().Name(name).Help(help).Labels(model).Register(*registry).Add(
        {}, std::move(buckets));
  }

  // Each replica's last state and the totals its counters have taken in so far.
  struct Replica {
    std::int64_t running = 0, waiting = 0, blocks = 0;
    double kv_usage = 0.0;
    std::int64_t reported_preemptions = 0, reported_queried = 0, reported_hits = 0;
    std::int64_t reported_drafts = 0, reported_draft_tokens = 0, reported_accepted = 0;
    std::vector<std::int64_t> reported_accepted_per_pos;
    std::vector<std::int64_t> running_by_adapter, waiting_by_adapter;
  };
  std::mutex mutex;
  std::map<std::int32_t, Replica> replicas;
  // The whole engine (every replica summed) ...
  p::Gauge& running = gauge("troupe_num_requests_running", "Requests running (holding KV blocks)");
  p::Gauge& waiting = gauge("troupe_num_requests_waiting", "Requests waiting to be scheduled");
  p::Gauge& kv_usage =
      gauge("troupe_kv_cache_usage_ratio", "Fraction of KV-cache blocks held by requests");
  // ... and each replica.
  // Per LoRA adapter (set_lora_adapters; registered only when adapters are served):
  // lora_names[i] is slot i + 1.
  std::vector<std::string> lora_names;
  p::Family<p::Gauge>* lora_running = nullptr;
  p::Family<p::Gauge>* lora_waiting = nullptr;
  p::Family<p::Gauge>& replica_running =
      gauge_family("troupe_replica_num_requests_running", "Requests running, by replica");
  p::Family<p::Gauge>& replica_waiting =
      gauge_family("troupe_replica_num_requests_waiting", "Requests waiting, by replica");
  p::Family<p::Gauge>& replica_kv_usage = gauge_family(
      "troupe_replica_kv_cache_usage_ratio", "Fraction of KV-cache blocks held, by replica");
  p::Family<p::Gauge>& replica_up =
      gauge_family("troupe_replica_up", "1 while a replica has a worker, by replica");
  p::Family<p::Counter>& replica_losses =
      counter_family("troupe_replica_losses_total", "Workers a replica lost, by replica");
  p::Counter& resubmitted =
      counter("troupe_resubmitted_requests_total",
              "Requests moved unseen to another replica when theirs lost its worker");
  p::Counter& migrations =
      counter("troupe_request_migrations_total",
              "Started requests resumed on another worker or replica after theirs was lost");
  // How many replicas there are, and the range they may move in (elastic).
  std::optional<std::int32_t> replica_count;
  p::Gauge& replicas_now = gauge("troupe_data_parallel_replicas",
                                 "Data-parallel replicas there now (up, loading or draining)");
  p::Gauge& replicas_min =
      gauge("troupe_data_parallel_replicas_min",
            "The fewest replicas the head waits for at start (the fixed count unless elastic)");
  p::Gauge& replicas_max =
      gauge("troupe_data_parallel_replicas_max", "The most replicas (+Inf: as many as nodes join)");
  p::Counter& replicas_added =
      counter("troupe_data_parallel_replicas_added_total",
              "Replicas started while serving, each on a node that joined (elastic)");
  p::Counter& replicas_removed = counter("troupe_data_parallel_replicas_removed_total",
                                         "Replicas that left with their node (elastic)");
  p::Gauge& nodes = gauge("troupe_cluster_nodes", "Nodes joined to the head");
  p::Counter& node_joins = counter("troupe_cluster_node_joins_total", "Node joins");
  p::Counter& prompt_tokens = counter("troupe_prompt_tokens_total", "Prompt tokens computed");
  p::Counter& generation_tokens = counter("troupe_generation_tokens_total", "Tokens generated");
  p::Counter& preemptions = counter("troupe_num_preemptions_total", "Sequences preempted");
  p::Counter& prefix_queries =
      counter("troupe_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache");
  p::Counter& prefix_hits =
      counter("troupe_prefix_cache_hits_total", "Prompt tokens found in the prefix cache");
  // Speculative decoding (vLLM's vllm:spec_decode_* counters).
  p::Counter& spec_drafts = counter("troupe_spec_decode_num_drafts_total",
                                    "Drafts verified (one sequence's proposal in one step)");
  p::Counter& spec_draft_tokens =
      counter("troupe_spec_decode_num_draft_tokens_total", "Proposed tokens verified");
  p::Counter& spec_accepted =
      counter("troupe_spec_decode_num_accepted_tokens_total", "Proposed tokens accepted");
  p::Family<p::Counter>& spec_accepted_per_pos =
      counter_family("troupe_spec_decode_num_accepted_tokens_per_pos_total",
                     "Proposed tokens accepted, by position in the draft (0: the first)");
  p::Family<p::Counter>& outcomes =
      counter_family("troupe_request_success_total", "Requests ended, by finish reason");
  p::Histogram& ttft = histogram("troupe_time_to_first_token_seconds",
                                 "Time from submission to the first token", latency_buckets());
  p::Histogram& itl = histogram("troupe_inter_token_latency_seconds",
                                "Time between two tokens of a request", latency_buckets());
  p::Histogram& tpot =
      histogram("troupe_time_per_output_token_seconds",
                "Mean time per output token after the first, per request", latency_buckets());
  p::Histogram& e2e = histogram("troupe_e2e_request_latency_seconds",
                                "Time from submission to the last token", latency_buckets());
  p::Histogram& queue =
      histogram("troupe_request_queue_time_seconds",
                "Time from submission to the first scheduled step", latency_buckets());
  p::Histogram& prefill =
      histogram("troupe_request_prefill_time_seconds",
                "Time from a request's first scheduled step to its first token", latency_buckets());
  p::Histogram& decode =
      histogram("troupe_request_decode_time_seconds",
                "Time from a request's first token to its last", latency_buckets());
  p::Histogram& request_prompt_tokens = histogram(
      "troupe_request_prompt_tokens", "Prompt tokens of each ended request", token_count_buckets());
  p::Histogram& request_generation_tokens =
      histogram("troupe_request_generation_tokens", "Tokens generated for each ended request",
                token_count_buckets());
  p::Histogram& iteration = histogram("troupe_iteration_duration_seconds",
                                      "Model step time (forward and sampling)", latency_buckets());
  p::Histogram& step_overhead = histogram(
      "troupe_step_overhead_seconds",
      "Per step, the round trip to the worker minus the worker's own time (messaging, network)",
      {0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1});
  p::Histogram& pipeline_hop = histogram(
      "troupe_pipeline_hop_seconds",
      "Per pipeline hop, from the stage before sending a step's hidden states (or the stage "
      "posting its receive, if later) to the stage holding them, on the receiving stage",
      {0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1});
  p::Histogram& iteration_tokens =
      histogram("troupe_iteration_tokens", "Tokens run through the model per iteration",
                {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192});
  p::Family<p::Counter>& http =
      counter_family("troupe_http_requests_total", "HTTP requests answered, by route and status");
  p::Gauge& connections = gauge("troupe_http_connections", "Open HTTP and WebSocket connections");
  p::Gauge& requests_in_flight =
      gauge("troupe_http_requests_in_flight",
            "Generation requests admitted and not yet ended in the engine");
  p::Gauge& draining = gauge("troupe_server_draining",
                             "1 while the server drains (SIGTERM or POST /v1/admin/drain): "
                             "it admits no new generation and ends what runs");
  p::Gauge& live_actors = gauge("troupe_live_actors", "Actors alive in the engine's actor system");
  p::Family<p::Counter>& connection_errors = counter_family(
      "troupe_http_connection_errors_total", "Connections the server ended on its own, by reason");
  p::Counter& accept_errors =
      counter("troupe_http_accept_errors_total", "Failed accepts (retried after a short backoff)");
};

Metrics::Metrics(std::string model_name, std::int32_t num_replicas)
    : impl_(std::make_unique<Impl>(std::move(model_name), num_replicas)) {}
Metrics::~Metrics() = default;

namespace {

// The process_* families under the names and types every Prometheus client library
// gives them, without the model label: dashboards of process metrics select by job.
std::vector<p::MetricFamily> process_families(const ProcessStats& stats) {
  std::vector<p::MetricFamily> families;
  auto add = [&](const char* name, const char* help, p::MetricType type,
                 const std::optional<double>& value) {
    if (!value) return;
    p::ClientMetric metric;
    (type == p::MetricType::Counter ? metric.counter.value : metric.gauge.value) = *value;
    families.push_back({name, help, type, {metric}});
  };
  add("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
      p::MetricType::Counter, stats.cpu_seconds);
  add("process_open_fds", "Number of open file descriptors.", p::MetricType::Gauge, stats.open_fds);
  add("process_max_fds", "Maximum number of open file descriptors.", p::MetricType::Gauge,
      stats.max_fds);
  add("process_virtual_memory_bytes", "Virtual memory size in bytes.", p::MetricType::Gauge,
      stats.virtual_memory_bytes);
  add("process_resident_memory_bytes", "Resident memory size in bytes.", p::MetricType::Gauge,
      stats.resident_memory_bytes);
  add("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
      p::MetricType::Gauge, stats.start_time_seconds);
  return families;
}

}  // namespace

std::string Metrics::serialize() const {
  auto families = impl_->registry->Collect();
  for (auto& family : process_families(read_process_stats())) {
    families.push_back(std::move(family));
  }
  std::ostringstream out;
  p::TextSerializer().Serialize(out, families);
  return out.str();
}

void Metrics::record_pipeline_hops(const std::vector<double>& seconds) {
  for (const double s : seconds) impl_->pipeline_hop.Observe(std::max(0.0, s));
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
    add(m.spec_drafts,
        it.spec_drafts_total - std::exchange(r.reported_drafts, it.spec_drafts_total));
    add(m.spec_draft_tokens,
        it.spec_draft_tokens_total -
            std::exchange(r.reported_draft_tokens, it.spec_draft_tokens_total));
    add(m.spec_accepted, it.spec_accepted_tokens_total -
                             std::exchange(r.reported_accepted, it.spec_accepted_tokens_total));
    auto& reported = r.reported_accepted_per_pos;
    if (reported.size() < it.spec_accepted_per_pos_total.size()) {
      reported.resize(it.spec_accepted_per_pos_total.size(), 0);
    }
    for (std::size_t pos = 0; pos < it.spec_accepted_per_pos_total.size(); ++pos) {
      add(m.spec_accepted_per_pos.Add({{"position", std::to_string(pos)}}),
          it.spec_accepted_per_pos_total[pos] -
              std::exchange(reported[pos], it.spec_accepted_per_pos_total[pos]));
    }
  }
  if (m.lora_running != nullptr) {
    std::lock_guard lock(m.mutex);
    auto& r = m.replicas[it.replica];
    r.running_by_adapter = it.running_by_adapter;
    r.waiting_by_adapter = it.waiting_by_adapter;
    const auto at = [](const std::vector<std::int64_t>& v, std::size_t slot) {
      return slot < v.size() ? v[slot] : 0;
    };
    for (std::size_t i = 0; i < m.lora_names.size(); ++i) {
      if (m.lora_names[i].empty()) continue;  // an empty slot
      std::int64_t running = 0, waiting = 0;
      for (const auto& [index, each] : m.replicas) {
        running += at(each.running_by_adapter, i + 1);
        waiting += at(each.waiting_by_adapter, i + 1);
      }
      const p::Labels label{{"lora_name", m.lora_names[i]}};
      m.lora_running->Add(label).Set(static_cast<double>(running));
      m.lora_waiting->Add(label).Set(static_cast<double>(waiting));
    }
  }
  set_replica_load(it.replica, it.num_running, it.num_waiting, it.kv_usage, it.num_kv_blocks);
}

void Metrics::name_lora_adapter(std::int32_t slot, const std::string& name) {
  auto& m = *impl_;
  if (slot < 1) return;
  std::lock_guard lock(m.mutex);
  m.add_lora_families();
  const auto index = static_cast<std::size_t>(slot - 1);
  if (m.lora_names.size() <= index) m.lora_names.resize(index + 1);
  if (const std::string& old = m.lora_names[index]; !old.empty()) {
    m.lora_running->Remove(&m.lora_running->Add({{"lora_name", old}}));
    m.lora_waiting->Remove(&m.lora_waiting->Add({{"lora_name", old}}));
  }
  m.lora_names[index] = name;
  if (!name.empty()) {
    m.lora_running->Add({{"lora_name", name}});
    m.lora_waiting->Add({{"lora_name", name}});
  }
}

void Metrics::set_lora_adapters(const std::vector<std::string>& names) {
  auto& m = *impl_;
  if (names.empty()) return;
  std::lock_guard lock(m.mutex);
  m.add_lora_families();
  m.lora_names = names;
  for (const auto& name : names) {
    m.lora_running->Add({{"lora_name", name}});
    m.lora_waiting->Add({{"lora_name", name}});
  }
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

void Metrics::replica_left(std::int32_t replica) {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->replicas[replica] = Impl::Replica{};
  }
  set_replica_up(replica, false);
  set_replica_load(replica, 0, 0, 0.0, 0);
}

void Metrics::set_replica_count(std::int32_t current, std::int32_t min, std::int32_t max) {
  auto& m = *impl_;
  std::lock_guard lock(m.mutex);
  if (m.replica_count) {
    const std::int32_t before = *m.replica_count;
    if (current > before) m.replicas_added.Increment(current - before);
    if (current < before) m.replicas_removed.Increment(before - current);
  }
  m.replica_count = current;
  m.replicas_now.Set(current);
  m.replicas_min.Set(min);
  m.replicas_max.Set(max < 0 ? std::numeric_limits<double>::infinity() : max);
}

void Metrics::record_replica_loss(std::int32_t replica, std::int64_t num_resubmitted) {
  impl_->replica_losses.Add({{"replica", std::to_string(replica)}}).Increment();
  if (num_resubmitted > 0) impl_->resubmitted.Increment(static_cast<double>(num_resubmitted));
}

void Metrics::record_migrations(std::int64_t num_requests) {
  impl_->migrations.Increment(static_cast<double>(num_requests));
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

void Metrics::observe_request_tokens(std::int32_t num_prompt_tokens,
                                     std::int32_t num_generated_tokens) {
  // A negative count is a caller's slip: left out rather than thrown into an actor.
  if (num_prompt_tokens >= 0) impl_->request_prompt_tokens.Observe(num_prompt_tokens);
  if (num_generated_tokens >= 0) impl_->request_generation_tokens.Observe(num_generated_tokens);
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

void Metrics::set_draining(bool draining) {
  impl_->draining.Set(draining ? 1.0 : 0.0);
}

void Metrics::count_connection_error(std::string_view reason) {
  impl_->connection_errors.Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::count_accept_error() {
  impl_->accept_errors.Increment();
}

}  // namespace troupe::monitoring
