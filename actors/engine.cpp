// Engine: the C++ API over the actors. It opens the model (tokenizer and shape), opens
// a cluster's port when it heads one, starts each replica (actors/replica/replica_start)
// and the router in front of several, and turns calls into messages.
#include "troupe/engine.hpp"
#include "monitoring/log.hpp"

#include <caf/io/all.hpp>

#include <atomic>
#include <cstdio>
#include <thread>

#include "actors/cluster/cluster_port.hpp"
#include "actors/cluster/registry_actor.hpp"
#include "actors/engine_hooks.hpp"
#include "actors/lora_slots.hpp"
#include "actors/messages.hpp"
#include "actors/parallel/router_actor.hpp"
#include "actors/replica/replica_start.hpp"
#include "actors/request_actor.hpp"
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
  actors::front_actor front;                           // the one replica's, or the router
  actors::cluster::registry_actor registry;            // a cluster's head: where nodes join
  std::shared_ptr<actors::cluster::ClusterGate> gate;  // what its port lets in
  std::uint16_t cluster_port = 0;                      // where it is published (0: not yet)
  std::shared_ptr<std::atomic<std::int32_t>> replicas_up =
      std::make_shared<std::atomic<std::int32_t>>(0);
  // Replicas there now: the fixed count, or (elastic) as the router tells it.
  std::shared_ptr<std::atomic<std::int32_t>> replicas_now =
      std::make_shared<std::atomic<std::int32_t>>(0);
  std::atomic<RequestId> next_id{1};
  // Which LoRA slots hold an adapter, and their running requests (shared with the
  // requests' callbacks, which may outlive a call).
  std::shared_ptr<actors::LoraSlots> lora_slots;
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
  const int nodes = impl.config.data_parallel_size * impl.config.tensor_parallel_size *
                    impl.config.pipeline_parallel_size;
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

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  if (!impl_ || !impl_->system) return;
  caf::anon_send_exit(impl_->front, caf::exit_reason::user_shutdown);
  impl_->front = nullptr;
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
  if (config.data_parallel_size < 1 || config.tensor_parallel_size < 1 ||
      config.pipeline_parallel_size < 1) {
    return make_error(ErrorCode::invalid_argument,
                      "data_parallel_size, tensor_parallel_size and pipeline_parallel_size must "
                      "be at least 1");
  }
  if (config.elastic() && !config.cluster) {
    return make_error(ErrorCode::invalid_argument,
                      "elastic data parallelism (a range of replicas, or auto) needs a cluster "
                      "port: its replicas come and go with the nodes");
  }
  if (config.elastic() && config.data_parallel_max < config.data_parallel_size) {
    return make_error(ErrorCode::invalid_argument, "data_parallel_max " +
                                                       std::to_string(config.data_parallel_max) +
                                                       " is below data_parallel_size " +
                                                       std::to_string(config.data_parallel_size));
  }
  if (config.cluster && config.cluster->token.empty() && !is_loopback(config.cluster->host)) {
    return make_error(ErrorCode::invalid_argument, "refusing to open the cluster port on " +
                                                       config.cluster->host +
                                                       " without a cluster token");
  }
  if (config.max_loras < 0) {
    return make_error(ErrorCode::invalid_argument, "max_loras must not be negative");
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->lora_slots = std::make_shared<actors::LoraSlots>(
      config.max_loras, static_cast<std::int32_t>(config.lora_adapters.size()));
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
  // A pipeline without a partition of its own splits the layers by what a decode step
  // reads of each (the last stage also reads the head): every stage and the head's views
  // get that one partition (none where there are more stages than layers: refused below).
  auto& partition = impl->config.pipeline_layer_partition;
  if (config.pipeline_parallel_size > 1 && partition.empty()) {
    partition = model::weight_balanced_partition(*impl->model->file, impl->model->config,
                                                 config.pipeline_parallel_size);
  }
  if (config.pipeline_parallel_size > 1 || !partition.empty()) {
    TROUPE_TRY(const auto stages, model::stage_layers(impl->model->config.num_layers,
                                                      config.pipeline_parallel_size, partition));
    monitoring::log_debug("pipeline stages: " + model::describe_stages(stages));
  }
  auto spec = worker::spec_for(impl->config, config.model_path, impl->max_model_len);
  spec.model_fingerprint = model::file_fingerprint(*impl->model->file);
  // A node's draft file is checked as its model file is: the same bytes as the head's.
  if (!spec.draft_model_path.empty()) {
    auto draft = gguf::GgufFile::open(spec.draft_model_path);
    if (!draft) {
      return make_error(draft.error().code,
                        "the draft model " + spec.draft_model_path + ": " + draft.error().message);
    }
    spec.draft_model_fingerprint = model::file_fingerprint(*draft);
    TROUPE_TRY(const auto draft_config, model::LlamaConfig::from_gguf(*draft));
    impl->config.speculative.draft_context_length = draft_config.context_length;
  }

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
  const std::int32_t local_workers =
      num_replicas * config.tensor_parallel_size * config.pipeline_parallel_size;
  if (local_workers > 1 && spec.num_threads == 0 && !config.cluster) {
    // Local replicas and ranks share the cores rather than each taking all of them.
    const auto cores = static_cast<std::int32_t>(std::max(1U, std::thread::hardware_concurrency()));
    spec.num_threads = std::max(1, cores / local_workers);
  }
  actors::ReplicaStart every;  // what each replica gets but its index
  every.spec = spec;
  every.max_model_len = impl->max_model_len;
  every.end_of_generation = impl->tokenizer->vocabulary().end_of_generation;
  every.registry = impl->registry;
  every.before_step = hooks.before_step;
  every.replicas_up = impl->replicas_up;
  auto started = actors::start_replicas(*impl->system, impl->config, every);
  if (!started) {
    abandon(replicas);
    return tl::unexpected(started.error());
  }
  for (auto& replica : *started) {
    // Every replica has the same shape: the last one's report stands for all.
    impl->device_description = replica.report.device_name;
    impl->weight_bytes = replica.report.weight_bytes;
    impl->kv_cache_bytes =
        static_cast<std::int64_t>(replica.report.num_kv_blocks) * replica.report.bytes_per_block;
    impl->token_budget_description = std::move(replica.token_budget_description);
    replicas.push_back(std::move(replica.scheduler));
  }
  if (impl->registry) {
    // A node's drain reaches its replicas through the registry.
    std::vector<caf::actor> handles;
    for (const auto& r : replicas) handles.push_back(caf::actor_cast<caf::actor>(r));
    caf::scoped_actor self{*impl->system, /*hide=*/true};
    self->send(impl->registry, actors::replicas_atom::value, std::move(handles));
  }
  *impl->replicas_now = num_replicas;
  engine::RouterConfig routing;
  routing.policy = config.routing;
  const caf::timespan failover =
      config.cluster ? caf::timespan{config.cluster->failover_timeout} : caf::timespan{0};
  if (config.elastic()) {
    // Always a router: replicas join it as nodes with room do, and leave with theirs.
    actors::parallel::ElasticSetup elastic;
    elastic.factory = std::make_shared<const actors::ReplicaFactory>(impl->config, every);
    elastic.min = config.data_parallel_size;
    elastic.max = config.data_parallel_max;
    elastic.registry = impl->registry;
    elastic.count = impl->replicas_now;
    elastic.metrics = config.metrics;
    impl->front = impl->system->spawn(actors::parallel::elastic_router, std::move(replicas),
                                      routing, failover, std::move(elastic));
  } else if (num_replicas == 1) {
    impl->front = std::move(replicas.front());
  } else {
    impl->front =
        impl->system->spawn(actors::parallel::router, std::move(replicas), routing, failover);
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
  // The sampler's own checks, now, so that bad parameters are the caller's error.
  TROUPE_TRY_VOID(model::Sampler::create(request.params, {}, {}, vocab).map([](auto&&) {}));
  if (!on_event) return make_error(ErrorCode::invalid_argument, "no event callback");
  if (*impl.replicas_up == 0) {
    return make_error(ErrorCode::unavailable,
                      "no replica is up: every worker was lost; try again when a node joins");
  }
  // Last: from here the request runs, and its adapter's slot is held until it ends.
  const std::int32_t slot = request.lora_adapter;
  TROUPE_TRY_VOID(impl.lora_slots->acquire(slot));
  if (slot > 0) {
    on_event = [inner = std::move(on_event), slots = impl.lora_slots, slot](const TokenEvent& e) {
      inner(e);
      if (e.finished) slots->release(slot);
    };
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
  setup->front = impl.front;
  setup->metrics = impl.config.metrics;
  setup->submitted = std::chrono::steady_clock::now();
  auto requester = impl.system->spawn(actors::request, setup);
  caf::anon_send(impl.front, actors::submit_atom::value,
                 actors::Submission{id, std::move(request.prompt), request.params, request.priority,
                                    std::move(requester), request.lora_adapter});
  return id;
}

namespace {

// Asks the front to put `path` in `slot` on every worker: "" when done, else why not.
std::string send_lora(Engine::Impl& impl, std::int32_t slot, const std::string& path) {
  std::string error = "the engine did not answer";
  caf::scoped_actor self{*impl.system, /*hide=*/true};
  self->request(impl.front, actors::kGroupLoadTimeout, actors::lora_atom::value, slot, path)
      .receive([&](const std::string& answer) { error = answer; },
               [&](const caf::error& e) { error += ": " + impl.system->render(e); });
  return error;
}

}  // namespace

Result<std::int32_t> Engine::load_lora_adapter(const std::string& path) {
  const ForgetLogger forget;
  auto& impl = *impl_;
  if (path.empty()) return make_error(ErrorCode::invalid_argument, "no LoRA adapter path given");
  TROUPE_TRY(const std::int32_t slot, impl.lora_slots->reserve());
  const std::string error = send_lora(impl, slot, path);
  if (error.empty()) {
    impl.lora_slots->fill(slot);
    return slot;
  }
  // No worker keeps what some read: the slot is emptied everywhere before it is free.
  send_lora(impl, slot, "");
  impl.lora_slots->give_back(slot);
  return make_error(ErrorCode::invalid_argument, error);
}

Result<void> Engine::unload_lora_adapter(std::int32_t slot) {
  const ForgetLogger forget;
  auto& impl = *impl_;
  TROUPE_TRY(const bool idle, impl.lora_slots->unload(slot));
  // Idle: its weights go now. Else the requests still running with it keep it; its
  // weights go when a later load fills the slot.
  if (idle) {
    send_lora(impl, slot, "");
    impl.lora_slots->give_back(slot);
  }
  return {};
}

std::int32_t Engine::num_lora_slots() const {
  return impl_->lora_slots->num_slots();
}

void Engine::cancel(RequestId id) {
  const ForgetLogger forget;
  caf::anon_send(impl_->front, actors::abort_atom::value, id, FinishReason::abort);
}

EngineStats Engine::stats() const {
  EngineStats result;
  // Hidden: a query's own actor is not counted among the live ones (a caller asking at
  // the same moment, the log's periodic line, say, would move the count).
  const ForgetLogger forget;
  caf::scoped_actor self{*impl_->system, /*hide=*/true};
  self->request(impl_->front, caf::infinite, actors::stats_atom::value)
      .receive([&](const EngineStats& s) { result = s; }, [](const caf::error&) {});
  result.num_live_actors = static_cast<std::int64_t>(impl_->system->registry().running());
  return result;
}

std::vector<ReplicaStats> Engine::replicas() const {
  std::vector<ReplicaStats> result;
  const ForgetLogger forget;
  caf::scoped_actor self{*impl_->system, /*hide=*/true};
  self->request(impl_->front, caf::infinite, actors::replicas_atom::value)
      .receive([&](std::vector<ReplicaStats>& r) { result = std::move(r); },
               [](const caf::error&) {});
  return result;
}

std::int32_t Engine::num_replicas_up() const {
  return impl_->replicas_up->load();
}

std::int32_t Engine::num_replicas() const {
  return impl_->replicas_now->load();
}

ReplicaCount Engine::replica_count() const {
  const EngineConfig& config = impl_->config;
  ReplicaCount count;
  count.up = impl_->replicas_up->load();
  count.current = impl_->replicas_now->load();
  count.min = config.data_parallel_size;
  count.max = config.elastic() ? config.data_parallel_max : config.data_parallel_size;
  count.elastic = config.elastic();
  return count;
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
                                n.slots, n.info.collective_host, n.draining});
            }
          },
          [](const caf::error&) {});
  return result;
}

NodeDrain Engine::drain_node(const std::string& name) {
  if (!impl_->registry) return NodeDrain::unknown;
  const ForgetLogger forget;
  caf::scoped_actor self{*impl_->system, /*hide=*/true};
  auto answer = actors::cluster::DrainAnswer::unknown;
  self->request(impl_->registry, std::chrono::seconds(5), actors::drain_atom::value, name)
      .receive([&](std::int32_t a) { answer = static_cast<actors::cluster::DrainAnswer>(a); },
               [](const caf::error&) {});
  switch (answer) {
    case actors::cluster::DrainAnswer::started:
      return NodeDrain::started;
    case actors::cluster::DrainAnswer::already:
      return NodeDrain::already;
    case actors::cluster::DrainAnswer::unknown:
      break;
  }
  return NodeDrain::unknown;
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

SchedulingPolicy Engine::scheduling_policy() const {
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
