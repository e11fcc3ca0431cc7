#include "actors/replica/replica_start.hpp"

#include <cstdio>

namespace troupe::actors {

namespace {

engine::SchedulerConfig scheduler_config(const EngineConfig& config, std::int32_t max_model_len,
                                         std::int32_t num_blocks) {
  engine::SchedulerConfig sc;
  sc.max_num_batched_tokens = config.max_num_batched_tokens;
  sc.max_num_seqs = config.max_num_seqs;
  sc.max_model_len = max_model_len;
  sc.num_blocks = num_blocks;
  sc.block_size = config.block_size;
  sc.enable_prefix_caching = config.enable_prefix_caching;
  sc.speculation = config.speculative;
  sc.policy = config.policy;
  sc.mode = config.mode;
  // A pipeline keeps up to one step a stage in flight (or as many as asked), so that its
  // stages work at once; an unsplit replica's steps follow each other.
  if (config.pipeline_parallel_size > 1) {
    sc.max_steps_in_flight = config.pipeline_steps_in_flight > 0 ? config.pipeline_steps_in_flight
                                                                 : config.pipeline_parallel_size;
  }
  return sc;
}

std::optional<engine::TokenBudgetConfig> token_budget_config(const EngineConfig& config) {
  if (!config.auto_token_budget || config.mode != BatchingMode::continuous) return std::nullopt;
  engine::TokenBudgetConfig tb;
  tb.target_step_seconds = config.target_itl_ms / 1000.0;
  tb.decode_step_multiple = config.itl_decode_step_multiple;
  // A request that waits a whole target step for a seat is a queue the decodes' bound would
  // keep (issue 35: past saturation the default lost 7% of goodput to fixed budgets).
  tb.backlog_wait_seconds = tb.target_step_seconds;
  tb.target_tpot_seconds = config.target_tpot_ms / 1000.0;
  tb.max_tokens = config.max_num_batched_tokens;
  tb.granularity = std::min(config.block_size, config.max_num_batched_tokens);
  tb.initial_tokens = std::min(256, config.max_num_batched_tokens);
  return tb;
}

// The budget a replica starts with, for people: what it chose and from what.
std::string describe_token_budget(const EngineConfig& config,
                                  const std::optional<engine::TokenBudgetConfig>& auto_config,
                                  const std::vector<engine::StepCost>& step_costs) {
  if (config.mode == BatchingMode::static_batch) return "none (static batching)";
  if (!auto_config) return std::to_string(config.max_num_batched_tokens) + " tokens per step";
  engine::TokenBudget budget(*auto_config);
  budget.calibrate(step_costs);
  char measured[128];
  if (step_costs.empty()) {
    std::snprintf(measured, sizeof measured, "not measured at load: learnt from the first steps");
  } else {
    std::snprintf(measured, sizeof measured, "measured %.1f ms + %.3f ms per token",
                  budget.model().fixed_seconds * 1000.0, budget.model().seconds_per_token * 1000.0);
  }
  char target[192];
  if (config.target_tpot_ms > 0) {
    std::snprintf(target, sizeof target, "the running streams' slack under a TPOT of %.0f ms",
                  config.target_tpot_ms);
  } else if (config.itl_decode_step_multiple > 0) {
    std::snprintf(target, sizeof target,
                  "%.3g x the decodes' own step, at most %.0f ms; %.0f ms while a request waits "
                  "that long for a seat",
                  config.itl_decode_step_multiple, config.target_itl_ms, config.target_itl_ms);
  } else {
    std::snprintf(target, sizeof target, "%.0f ms", config.target_itl_ms);
  }
  char text[448];
  std::snprintf(text, sizeof text,
                "auto, %d tokens per step beside a decode, %d with none (target %s; %s)",
                budget.budget(1), config.max_num_batched_tokens, target, measured);
  return text;
}

}  // namespace

namespace {

// Where replica `index`'s workers come from, and how long a step of a remote one may take.
WorkerSource worker_source(const EngineConfig& config, const ReplicaStart& start,
                           std::int32_t index, caf::duration& step_timeout) {
  WorkerSource source;
  source.replica = index;
  // A pipeline's stages are placed and driven as a group's ranks are.
  source.tensor_parallel_size = config.tensor_parallel_size * config.pipeline_parallel_size;
  // ... but each stage (its tensor-parallel ranks) on a node of its own, which then holds
  // only its layers.
  if (config.pipeline_parallel_size > 1) source.stage_ranks = config.tensor_parallel_size;
  source.collective_timeout = config.collective_timeout;
  source.before_step = start.before_step;
  source.num_replicas = config.data_parallel_size;
  step_timeout = caf::infinite;
  // Replica 0 may run in the head itself (ClusterConfig::head_hosts_replica).
  if (config.cluster && !(config.cluster->head_hosts_replica && index == 0)) {
    source.registry = start.registry;
    source.placement_wait = config.cluster->wait;
    source.nodes_needed =
        (config.data_parallel_size - (config.cluster->head_hosts_replica ? 1 : 0)) *
        (source.stage_ranks > 0 ? config.pipeline_parallel_size : 1);
    source.load_timeout = caf::duration{kGroupLoadTimeout};
    step_timeout = caf::duration{config.cluster->step_timeout};
  }
  return source;
}

// The replica's scheduler, around the worker its supply brought.
StartedReplica make_replica(caf::actor_system& system, const EngineConfig& config,
                            ReplicaStart start, WorkerSource source, caf::duration step_timeout,
                            SupplyNews first) {
  StartedReplica started;
  started.report = first.report;
  ReplicaSetup setup;
  setup.index = start.index;
  setup.config = scheduler_config(config, start.max_model_len, first.report.num_kv_blocks);
  setup.token_budget = token_budget_config(config);
  started.token_budget_description =
      describe_token_budget(config, setup.token_budget, first.report.step_costs);
  setup.end_of_generation = std::move(start.end_of_generation);
  setup.first = std::move(first);
  setup.spec = std::move(start.spec);
  // An elastic replica on nodes leaves with its node rather than wait for another.
  setup.elastic = config.elastic() && source.registry != nullptr;
  if (config.cluster) setup.failover_timeout = caf::timespan{config.cluster->failover_timeout};
  source.placement_wait = std::chrono::seconds(0);  // a replacement waits for a node
  setup.source = std::move(source);
  setup.step_timeout = step_timeout;
  setup.metrics = config.metrics;
  setup.step_events = config.step_events;
  setup.replicas_up = std::move(start.replicas_up);
  // Counted up as it starts with a worker; the scheduler counts itself down and up again
  // as it loses and regains one (while later replicas are still being placed).
  ++*setup.replicas_up;
  started.scheduler = system.spawn(scheduler, std::move(setup));
  return started;
}

}  // namespace

Result<StartedReplica> start_replica(caf::actor_system& system, const EngineConfig& config,
                                     ReplicaStart start) {
  caf::duration step_timeout;
  WorkerSource source = worker_source(config, start, start.index, step_timeout);
  TROUPE_TRY(auto first, supply_and_wait(system, source, start.spec));
  return make_replica(system, config, std::move(start), std::move(source), step_timeout,
                      std::move(first));
}

Result<std::vector<StartedReplica>> start_replicas(caf::actor_system& system,
                                                   const EngineConfig& config,
                                                   const ReplicaStart& every) {
  std::vector<StartedReplica> started;
  if (!config.cluster) {
    for (std::int32_t i = 0; i < config.data_parallel_size; ++i) {
      ReplicaStart start = every;
      start.index = i;
      auto replica = start_replica(system, config, std::move(start));
      if (!replica) {
        for (auto& r : started) caf::anon_send_exit(r.scheduler, caf::exit_reason::user_shutdown);
        return tl::unexpected(replica.error());
      }
      started.push_back(std::move(*replica));
    }
    return started;
  }
  std::vector<WorkerSource> sources;
  std::vector<caf::duration> step_timeouts;
  for (std::int32_t i = 0; i < config.data_parallel_size; ++i) {
    caf::duration step_timeout;
    sources.push_back(worker_source(config, every, i, step_timeout));
    step_timeouts.push_back(step_timeout);
  }
  TROUPE_TRY(auto loaded, supply_all_and_wait(system, sources, every.spec));
  for (std::int32_t i = 0; i < config.data_parallel_size; ++i) {
    const auto at = static_cast<std::size_t>(i);
    ReplicaStart start = every;
    start.index = i;
    started.push_back(make_replica(system, config, std::move(start), std::move(sources[at]),
                                   step_timeouts[at], std::move(loaded[at])));
  }
  return started;
}

ReplicaFactory::ReplicaFactory(EngineConfig config, ReplicaStart start)
    : config_(std::move(config)), start_(std::move(start)) {}

void ReplicaFactory::supply(caf::actor_system& system, std::int32_t index, caf::actor_addr owner,
                            std::function<void(SupplyNews)> news) const {
  caf::duration step_timeout;
  WorkerSource source = worker_source(config_, start_, index, step_timeout);
  source.placement_wait = std::chrono::seconds(0);  // until a node with room joins
  // A node that cannot load it is marked unfit, and the next one is waited for.
  supply_worker(system, std::move(source), start_.spec, /*retry=*/true, 0, std::move(owner),
                std::move(news));
}

StartedReplica ReplicaFactory::make(caf::actor_system& system, std::int32_t index,
                                    SupplyNews first) const {
  ReplicaStart start = start_;
  start.index = index;
  caf::duration step_timeout;
  WorkerSource source = worker_source(config_, start, index, step_timeout);
  return make_replica(system, config_, std::move(start), std::move(source), step_timeout,
                      std::move(first));
}

}  // namespace troupe::actors
