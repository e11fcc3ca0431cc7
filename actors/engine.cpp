// Engine: the C++ API over the actors. It opens the model (tokenizer and shape),
// starts a worker and waits for its load report, builds the scheduler from it, and
// turns calls into messages.
#include "troupe/engine.hpp"
#include "monitoring/log.hpp"

#include <caf/io/all.hpp>

#include <atomic>
#include <cstdio>
#include <thread>

#include "actors/cluster/cluster_port.hpp"
#include "actors/cluster/group_actor.hpp"
#include "actors/cluster/registry_actor.hpp"
#include "actors/cluster/router_actor.hpp"
#include "actors/engine_hooks.hpp"
#include "actors/messages.hpp"
#include "actors/request_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/worker_actor.hpp"
#include "model/loaded_model.hpp"
#include "model/sampler.hpp"
#include "model/tensor_parallel.hpp"
#include "worker/backend_factory.hpp"

namespace troupe {

struct Engine::Impl {
  EngineConfig config;
  std::shared_ptr<model::LoadedModel> model;  // tokenizer and shape; no weights
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::int32_t max_model_len = 0;
  std::string device_description;
  std::int64_t weight_bytes = 0;    // a replica's, as its worker (or group) reported them
  std::int64_t kv_cache_bytes = 0;  // a replica's KV pool
  std::string token_budget_description;
  caf::actor_system_config actor_config;
  std::unique_ptr<caf::actor_system> system;
  actors::scheduler_actor scheduler;                   // the one replica's, or the router
  actors::cluster::registry_actor registry;            // a cluster's head: where nodes join
  std::shared_ptr<actors::cluster::ClusterGate> gate;  // what its port lets in
  std::uint16_t cluster_port = 0;                      // where it is published (0: not yet)
  std::shared_ptr<std::atomic<std::int32_t>> replicas_up =
      std::make_shared<std::atomic<std::int32_t>>(0);
  std::atomic<RequestId> next_id{1};
};

namespace {

// CAF 0.17 leaves every thread that makes the actor system, spawns on it or makes a
// scoped_actor a thread-local reference to the system's logger, and ~actor_system waits
// until every such reference is gone: an engine destroyed on one thread, while another
// that had called it lived on (the one that made it, a server's I/O thread that
// submitted), waited forever. Each call that touches the actor system from its caller's
// thread holds one of these first: the thread lets go when the call returns, after the
// call's own actors are gone.
struct ForgetLogger {
  ForgetLogger() = default;
  ForgetLogger(const ForgetLogger&) = delete;
  ForgetLogger& operator=(const ForgetLogger&) = delete;
  ~ForgetLogger() { caf::logger::set_current_actor_system(nullptr); }
};

engine::SchedulerConfig scheduler_config(const EngineConfig& config, std::int32_t max_model_len,
                                         std::int32_t num_blocks) {
  engine::SchedulerConfig sc;
  sc.max_num_batched_tokens = config.max_num_batched_tokens;
  sc.max_num_seqs = config.max_num_seqs;
  sc.max_model_len = max_model_len;
  sc.num_blocks = num_blocks;
  sc.block_size = config.block_size;
  sc.enable_prefix_caching = config.enable_prefix_caching;
  sc.speculation.num_speculative_tokens = config.speculative.num_speculative_tokens;
  sc.speculation.prompt_lookup_max = config.speculative.prompt_lookup_max;
  sc.speculation.prompt_lookup_min = config.speculative.prompt_lookup_min;
  sc.speculation.disable_by_batch_size = config.speculative.disable_by_batch_size;
  sc.speculation.draft_model = !config.speculative.draft_model.empty();
  sc.policy = config.policy == BatchingPolicy::priority ? engine::SchedulingPolicy::priority
                                                        : engine::SchedulingPolicy::fcfs;
  sc.mode = config.mode == BatchingMode::static_batch ? engine::BatchingMode::static_batch
                                                      : engine::BatchingMode::continuous;
  return sc;
}

std::optional<engine::TokenBudgetConfig> token_budget_config(const EngineConfig& config) {
  if (!config.auto_token_budget || config.mode != BatchingMode::continuous) return std::nullopt;
  engine::TokenBudgetConfig tb;
  tb.target_step_seconds = config.target_itl_ms / 1000.0;
  tb.decode_step_multiple = config.itl_decode_step_multiple;
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
  char target[96];
  if (config.target_tpot_ms > 0) {
    std::snprintf(target, sizeof target, "the running streams' slack under a TPOT of %.0f ms",
                  config.target_tpot_ms);
  } else if (config.itl_decode_step_multiple > 0) {
    std::snprintf(target, sizeof target, "%.3g x the decodes' own step, at most %.0f ms",
                  config.itl_decode_step_multiple, config.target_itl_ms);
  } else {
    std::snprintf(target, sizeof target, "%.0f ms", config.target_itl_ms);
  }
  char text[320];
  std::snprintf(text, sizeof text,
                "auto, %d tokens per step beside a decode, %d with none (target %s; %s)",
                budget.budget(1), config.max_num_batched_tokens, target, measured);
  return text;
}

actors::cluster::TlsFiles tls_of(const ClusterConfig& cluster) {
  return {cluster.tls_certificate, cluster.tls_key, cluster.tls_ca};
}

// Ends the registry, off its port first.
void close_head(Engine::Impl& impl) {
  if (!impl.registry) return;
  if (impl.cluster_port != 0) {
    actors::cluster::unpublish_registry(impl.registry, impl.cluster_port,
                                        tls_of(*impl.config.cluster));
  }
  caf::weak_actor_ptr registry = caf::actor_cast<caf::weak_actor_ptr>(impl.registry);
  caf::anon_send_exit(impl.registry, caf::exit_reason::user_shutdown);
  impl.registry = nullptr;
  // A node that monitors the registry is told of its end through the middleman, which
  // holds the registry until the message is out. Stopping the middleman before then
  // strands that hold, and ~actor_system waits forever for the registry's detached
  // thread (seen: one shutdown in ~15 with a node connected). So: wait for its end.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (registry.lock() != nullptr) {
    if (std::chrono::steady_clock::now() >= deadline) {
      monitoring::log_warning("the cluster registry did not end within 5 s of shutdown");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// A descriptor limit that leaves the cluster port little room beside HTTP's reserve: the
// nodes it needs may be refused (said at start rather than found out at a join).
void warn_if_cramped(Engine::Impl& impl, const ClusterConfig& cluster) {
  const int room = impl.gate->room();
  const int nodes = impl.config.data_parallel_size * impl.config.tensor_parallel_size;
  if (room < 0 || room >= nodes + 4) return;
  monitoring::logf(monitoring::LogLevel::warning,
                   "the cluster port has room for %d connection(s) beside the %d descriptors "
                   "kept for HTTP: raise `ulimit -n`, or nodes may be refused",
                   std::max(room, 0), cluster.reserved_descriptors);
}

// Opens the cluster port: the registry nodes join.
Result<void> start_head(Engine::Impl& impl, const ClusterConfig& cluster) {
  if (cluster.token.empty()) {
    return make_error(ErrorCode::invalid_argument, "a cluster needs a token for its nodes");
  }
  if (cluster.handshake_timeout.count() <= 0 || cluster.max_pending_handshakes < 1) {
    return make_error(ErrorCode::invalid_argument,
                      "the cluster port needs a positive handshake timeout and room for at "
                      "least one handshake");
  }
  actors::cluster::GateLimits limits;
  limits.handshake_timeout = cluster.handshake_timeout;
  limits.max_pending = cluster.max_pending_handshakes;
  limits.reserved_descriptors = cluster.reserved_descriptors;
  impl.gate = std::make_shared<actors::cluster::ClusterGate>(limits);
  impl.registry = impl.system->spawn<caf::detached>(actors::cluster::registry, cluster.token,
                                                    impl.config.metrics, impl.gate);
  auto port = actors::cluster::publish_registry(impl.registry, cluster.port, cluster.host,
                                                tls_of(cluster), impl.gate);
  if (!port) {
    return make_error(ErrorCode::io, "cannot open the cluster port " + cluster.host + ":" +
                                         std::to_string(cluster.port) + ": " +
                                         impl.system->render(port.error()));
  }
  impl.cluster_port = *port;
  if (cluster.on_listening) cluster.on_listening(*port);
  warn_if_cramped(impl, cluster);
  return {};
}

// A worker on a node for replica `index`: waits for a free node up to the cluster's wait.
Result<actors::cluster::Placement> place_replica(Engine::Impl& impl, std::int32_t index) {
  const ClusterConfig& cluster = *impl.config.cluster;
  const std::int32_t nodes_needed =
      impl.config.data_parallel_size - (cluster.head_hosts_replica ? 1 : 0);
  Result<actors::cluster::Placement> result = make_error(ErrorCode::internal, "");
  const ForgetLogger forget;
  caf::scoped_actor self{*impl.system};
  self->request(impl.registry, cluster.wait, actors::cluster::place_atom::value, index,
                impl.config.tensor_parallel_size)
      .receive([&](actors::cluster::Placement& p) { result = std::move(p); },
               [&](const caf::error&) {
                 std::vector<std::string> names;
                 self->request(impl.registry, std::chrono::seconds(5),
                               actors::cluster::nodes_atom::value)
                     .receive(
                         [&](const std::vector<actors::cluster::NodeView>& nodes) {
                           for (const auto& n : nodes) names.push_back(n.info.name);
                         },
                         [](const caf::error&) {});
                 std::string joined;
                 for (const auto& n : names) joined += (joined.empty() ? "" : ", ") + n;
                 result = make_error(ErrorCode::unavailable,
                                     "no node to place replica " + std::to_string(index) +
                                         " on within " + std::to_string(cluster.wait.count()) +
                                         " s: " + std::to_string(impl.config.data_parallel_size) +
                                         " replica(s) of " +
                                         std::to_string(impl.config.tensor_parallel_size) +
                                         " rank(s) need " + std::to_string(nodes_needed) +
                                         " node(s) at least, and " + std::to_string(names.size()) +
                                         " joined" + (joined.empty() ? "" : " (" + joined + ")"));
               });
  return result;
}

// One replica: a worker (here, or on a node of the cluster) loaded from `spec`, and the
// scheduler sized from its report.
Result<actors::replica_actor> start_replica(Engine::Impl& impl, std::int32_t index,
                                            const engine::WorkerSpec& spec,
                                            const EngineHooks& hooks) {
  actors::ReplicaSetup setup;
  setup.index = index;
  setup.spec = spec;
  setup.before_step = hooks.before_step;
  setup.metrics = impl.config.metrics;
  setup.step_events = impl.config.step_events;
  setup.replicas_up = impl.replicas_up;
  setup.end_of_generation = impl.tokenizer->vocabulary().end_of_generation;
  setup.tensor_parallel_size = impl.config.tensor_parallel_size;
  setup.collective_timeout = impl.config.collective_timeout;
  caf::duration load_timeout = caf::infinite;
  const bool on_node =
      impl.config.cluster && !(impl.config.cluster->head_hosts_replica && index == 0);
  if (on_node) {
    TROUPE_TRY(auto placed, place_replica(impl, index));
    setup.nodes = placed.nodes;
    setup.node = actors::cluster::node_label(placed.nodes);
    setup.worker = actors::cluster::worker_for(*impl.system, std::move(placed),
                                               impl.config.collective_timeout);
    setup.registry = impl.registry;
    setup.step_timeout = caf::duration{impl.config.cluster->step_timeout};
    load_timeout = caf::duration{actors::kGroupLoadTimeout};
  } else {
    setup.worker =
        actors::cluster::spawn_local_worker(*impl.system, impl.config.tensor_parallel_size,
                                            hooks.before_step, impl.config.collective_timeout);
  }
  auto report = actors::load_and_wait(*impl.system, setup.worker, spec, load_timeout);
  if (!report) {
    caf::anon_send_exit(setup.worker, caf::exit_reason::kill);
    Error e = report.error();
    if (!setup.node.empty()) {
      e.message = "node " + setup.node + ": " + e.message;
      // Said at once, as a replica placed later says it: the engine's end may take a while.
      monitoring::logf(monitoring::LogLevel::warning, "replica %d cannot load on %s", index,
                       e.message.c_str());
    }
    return tl::unexpected(e);
  }
  impl.device_description = report->device_name;
  impl.weight_bytes = report->weight_bytes;
  impl.kv_cache_bytes = static_cast<std::int64_t>(report->num_kv_blocks) * report->bytes_per_block;
  setup.config = scheduler_config(impl.config, impl.max_model_len, report->num_kv_blocks);
  setup.token_budget = token_budget_config(impl.config);
  setup.step_costs = report->step_costs;
  impl.token_budget_description =
      describe_token_budget(impl.config, setup.token_budget, setup.step_costs);
  // Counted up as it starts with a worker; the scheduler counts itself down and up again
  // as it loses and regains one (while later replicas are still being placed).
  ++*impl.replicas_up;
  return impl.system->spawn(actors::scheduler, std::move(setup));
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  if (!impl_ || !impl_->system) return;
  caf::anon_send_exit(impl_->scheduler, caf::exit_reason::user_shutdown);
  impl_->scheduler = nullptr;
  close_head(*impl_);
  impl_->system->await_all_actors_done();
  impl_->system.reset();
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  return create(config, EngineHooks{});
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config,
                                               const EngineHooks& hooks) {
  const ForgetLogger forget;
  if (config.model_path.empty()) {
    return make_error(ErrorCode::invalid_argument, "no model path given");
  }
  if (config.block_size <= 0 || config.max_num_seqs <= 0 || config.max_num_batched_tokens <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "block_size, max_num_seqs and max_num_batched_tokens must be positive");
  }
  if (config.auto_token_budget && !(config.target_itl_ms > 0 && config.target_itl_ms < 1e9)) {
    return make_error(ErrorCode::invalid_argument,
                      "target_itl_ms must be a positive number of milliseconds");
  }
  if (const auto& s = config.speculative; s.enabled()) {
    const bool lookup_ok = !s.draft_model.empty() ||
                           (s.prompt_lookup_min >= 1 && s.prompt_lookup_max >= s.prompt_lookup_min);
    if (s.num_speculative_tokens > 32 || !lookup_ok || s.disable_by_batch_size < 1) {
      return make_error(ErrorCode::invalid_argument,
                        "speculative: num_speculative_tokens must be in [0, 32], "
                        "1 <= prompt_lookup_min <= prompt_lookup_max, and "
                        "disable_by_batch_size at least 1");
    }
  } else if (config.speculative.num_speculative_tokens < 0) {
    return make_error(ErrorCode::invalid_argument,
                      "speculative: num_speculative_tokens must be in [0, 32]");
  }
  if (config.data_parallel_size < 1 || config.tensor_parallel_size < 1) {
    return make_error(ErrorCode::invalid_argument,
                      "data_parallel_size and tensor_parallel_size must be at least 1");
  }
  if (config.cluster && config.cluster->token.empty() && !is_loopback(config.cluster->host)) {
    return make_error(ErrorCode::invalid_argument, "refusing to open the cluster port on " +
                                                       config.cluster->host +
                                                       " without a cluster token");
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  TROUPE_TRY(auto opened, model::LoadedModel::open(config.model_path));
  impl->model = std::make_shared<model::LoadedModel>(std::move(opened));
  impl->tokenizer =
      std::shared_ptr<const text::Tokenizer>(impl->model, impl->model->tokenizer.get());
  const std::int32_t context_length = impl->model->config.context_length;
  impl->max_model_len = config.max_model_len > 0 ? config.max_model_len : context_length;
  if (impl->max_model_len > context_length) {
    return make_error(ErrorCode::invalid_argument, "max_model_len " +
                                                       std::to_string(impl->max_model_len) +
                                                       " exceeds the model's context length of " +
                                                       std::to_string(context_length));
  }
  // A shape that cannot be split is refused before any worker starts (a quantized
  // tensor's blocks are checked by each rank as it loads).
  TROUPE_TRY_VOID(
      model::shard_layout(impl->model->config, {0, config.tensor_parallel_size}).map([](auto) {}));
  auto spec = worker::spec_for(config, config.model_path, impl->max_model_len);
  spec.model_fingerprint = model::file_fingerprint(*impl->model->file);

  // Blocking calls and cross-thread round trips are faster under the sharing policy.
  impl->actor_config.set("scheduler.policy", caf::atom("sharing"));
  actors::add_message_types(impl->actor_config);
  if (config.cluster) {
    if (auto bad = actors::cluster::check_tls_files(tls_of(*config.cluster)); !bad.empty()) {
      return make_error(ErrorCode::invalid_argument, bad);
    }
    actors::cluster::load_middleman(impl->actor_config, tls_of(*config.cluster));
    actors::cluster::add_cluster_types(impl->actor_config);
  }
  impl->system = std::make_unique<caf::actor_system>(impl->actor_config);
  // Whatever fails below, the actors started so far end with the system.
  auto abandon = [&impl](std::vector<actors::replica_actor>& started) {
    for (auto& r : started) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
    close_head(*impl);
    impl->system->await_all_actors_done();
  };
  std::vector<actors::replica_actor> replicas;
  if (config.cluster) {
    if (auto opened = start_head(*impl, *config.cluster); !opened) {
      abandon(replicas);
      return tl::unexpected(opened.error());
    }
  }
  const std::int32_t num_replicas = config.data_parallel_size;
  const std::int32_t local_workers = num_replicas * config.tensor_parallel_size;
  if (local_workers > 1 && spec.num_threads == 0 && !config.cluster) {
    // Local replicas and ranks share the cores rather than each taking all of them.
    const auto cores = static_cast<std::int32_t>(std::max(1U, std::thread::hardware_concurrency()));
    spec.num_threads = std::max(1, cores / local_workers);
  }
  for (std::int32_t i = 0; i < num_replicas; ++i) {
    auto replica = start_replica(*impl, i, spec, hooks);
    if (!replica) {
      abandon(replicas);
      return tl::unexpected(replica.error());
    }
    replicas.push_back(std::move(*replica));
  }
  if (num_replicas == 1) {
    impl->scheduler = std::move(replicas.front());
  } else {
    engine::RouterConfig routing;
    routing.policy = config.routing;
    impl->scheduler = impl->system->spawn(actors::router, std::move(replicas), routing);
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Result<RequestId> Engine::submit(GenerateRequest request, TokenCallback on_event) {
  const ForgetLogger forget;
  auto& impl = *impl_;
  const auto n = static_cast<std::int32_t>(request.prompt.size());
  if (n == 0) return make_error(ErrorCode::invalid_argument, "the prompt is empty");
  const auto vocab = static_cast<TokenId>(impl.tokenizer->size());
  for (TokenId t : request.prompt) {
    if (t < 0 || t >= vocab) {
      return make_error(ErrorCode::invalid_argument, "prompt token " + std::to_string(t) +
                                                         " is outside the vocabulary of " +
                                                         std::to_string(vocab));
    }
  }
  // In 64 bits: a caller's max_tokens may be anything up to INT32_MAX.
  const std::int64_t wanted = std::int64_t{n} + request.params.max_tokens;
  if (wanted > impl.max_model_len) {
    return make_error(
        ErrorCode::out_of_range,
        "this model's maximum context length is " + std::to_string(impl.max_model_len) +
            " tokens, but " + std::to_string(wanted) + " were requested (" + std::to_string(n) +
            " in the prompt, " + std::to_string(request.params.max_tokens) + " to generate)");
  }
  if (request.lora_adapter < 0 ||
      request.lora_adapter > static_cast<std::int32_t>(impl.config.lora_adapters.size())) {
    return make_error(ErrorCode::invalid_argument,
                      "LoRA adapter " + std::to_string(request.lora_adapter) + " of " +
                          std::to_string(impl.config.lora_adapters.size()) + " loaded");
  }
  // The sampler's own checks, now, so that bad parameters are the caller's error.
  TROUPE_TRY_VOID(model::Sampler::create(request.params, {}, {}, vocab).map([](auto&&) {}));
  if (!on_event) return make_error(ErrorCode::invalid_argument, "no event callback");
  if (*impl.replicas_up == 0) {
    return make_error(ErrorCode::unavailable,
                      "no replica is up: every worker was lost; try again when a node joins");
  }

  const RequestId id = impl.next_id.fetch_add(1);
  if (!request.params.seed && impl.config.seed) {
    request.params.seed = *impl.config.seed * 0x9e3779b97f4a7c15ULL + id;
  }
  auto setup = std::make_shared<actors::RequestSetup>();
  setup->id = id;
  setup->on_event = std::move(on_event);
  setup->tokenizer = impl.tokenizer;
  setup->stop = std::move(request.stop);
  setup->skip_special_tokens = request.skip_special_tokens;
  setup->include_stop_str_in_output = request.include_stop_str_in_output;
  setup->num_prompt_tokens = n;
  setup->timeout = request.timeout;
  setup->scheduler = impl.scheduler;
  setup->metrics = impl.config.metrics;
  setup->submitted = std::chrono::steady_clock::now();
  auto requester = impl.system->spawn(actors::request, setup);
  caf::anon_send(impl.scheduler, actors::submit_atom::value,
                 actors::Submission{id, std::move(request.prompt), request.params, request.priority,
                                    std::move(requester), request.lora_adapter});
  return id;
}

void Engine::cancel(RequestId id) {
  const ForgetLogger forget;
  caf::anon_send(impl_->scheduler, actors::abort_atom::value, id, FinishReason::abort);
}

EngineStats Engine::stats() const {
  EngineStats result;
  // Hidden: a query's own actor is not counted among the live ones (a caller asking at
  // the same moment, the log's periodic line, say, would move the count).
  const ForgetLogger forget;
  caf::scoped_actor self{*impl_->system, /*hide=*/true};
  self->request(impl_->scheduler, caf::infinite, actors::stats_atom::value)
      .receive([&](const EngineStats& s) { result = s; }, [](const caf::error&) {});
  result.num_live_actors = static_cast<std::int64_t>(impl_->system->registry().running());
  return result;
}

std::vector<ReplicaStats> Engine::replicas() const {
  std::vector<ReplicaStats> result;
  const ForgetLogger forget;
  caf::scoped_actor self{*impl_->system, /*hide=*/true};
  self->request(impl_->scheduler, caf::infinite, actors::replicas_atom::value)
      .receive([&](std::vector<ReplicaStats>& r) { result = std::move(r); },
               [](const caf::error&) {});
  return result;
}

std::int32_t Engine::num_replicas_up() const {
  return impl_->replicas_up->load();
}

std::int32_t Engine::num_replicas() const {
  return impl_->config.data_parallel_size;
}

bool Engine::is_cluster_head() const {
  return impl_->registry != nullptr;
}

std::vector<NodeStatus> Engine::nodes() const {
  std::vector<NodeStatus> result;
  if (!impl_->registry) return result;
  const ForgetLogger forget;
  caf::scoped_actor self{*impl_->system, /*hide=*/true};
  self->request(impl_->registry, std::chrono::seconds(5), actors::cluster::nodes_atom::value)
      .receive(
          [&](const std::vector<actors::cluster::NodeView>& nodes) {
            for (const auto& n : nodes) {
              result.push_back({n.info.name, n.address, n.info.device, n.info.num_cores,
                                n.info.memory_bytes, n.info.gpu_names, n.info.gpu_memory_bytes,
                                n.replica, n.unfit, static_cast<std::int32_t>(n.replicas.size()),
                                n.slots, n.info.collective_host});
            }
          },
          [](const caf::error&) {});
  return result;
}

const text::Tokenizer& Engine::tokenizer() const {
  return *impl_->tokenizer;
}

std::int32_t Engine::max_model_len() const {
  return impl_->max_model_len;
}

const std::string& Engine::chat_template() const {
  return impl_->model->chat_template;
}

std::int64_t Engine::weight_bytes() const {
  return impl_->weight_bytes;
}

BatchingPolicy Engine::scheduling_policy() const {
  return impl_->config.policy;
}

std::int64_t Engine::kv_cache_bytes() const {
  return impl_->kv_cache_bytes;
}

const std::string& Engine::device_description() const {
  return impl_->device_description;
}

const std::string& Engine::token_budget_description() const {
  return impl_->token_budget_description;
}

}  // namespace troupe
