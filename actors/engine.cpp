// Engine: the C++ API over the actors. It opens the model (tokenizer and shape),
// starts a worker and waits for its load report, builds the scheduler from it, and
// turns calls into messages.
#include "troupe/engine.hpp"

#include <atomic>
#include <thread>

#include "actors/engine_hooks.hpp"
#include "actors/messages.hpp"
#include "actors/request_actor.hpp"
#include "actors/router_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/worker_actor.hpp"
#include "model/loaded_model.hpp"
#include "model/sampler.hpp"
#include "worker/backend_factory.hpp"

namespace troupe {

struct Engine::Impl {
  EngineConfig config;
  std::shared_ptr<model::LoadedModel> model;  // tokenizer and shape; no weights
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::int32_t max_model_len = 0;
  std::string device_description;
  caf::actor_system_config actor_config;
  std::unique_ptr<caf::actor_system> system;
  actors::scheduler_actor scheduler;  // the one replica's, or the router
  std::atomic<RequestId> next_id{1};
};

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
  sc.policy = config.policy == BatchingPolicy::priority ? engine::SchedulingPolicy::priority
                                                        : engine::SchedulingPolicy::fcfs;
  sc.mode = config.mode == BatchingMode::static_batch ? engine::BatchingMode::static_batch
                                                      : engine::BatchingMode::continuous;
  return sc;
}

// Asks a fresh worker to load, and waits for its answer.
Result<engine::LoadReport> load_worker(caf::actor_system& system,
                                       const actors::worker_actor& worker,
                                       const engine::WorkerSpec& spec) {
  Result<engine::LoadReport> result = make_error(ErrorCode::internal, "the worker did not answer");
  caf::scoped_actor self{system};
  self->request(worker, caf::infinite, actors::load_atom::value, spec)
      .receive(
          [&](const engine::LoadReport& report) {
            if (report.failed) {
              result = make_error(report.error.code, report.error.message);
            } else {
              result = report;
            }
          },
          [&](const caf::error& err) {
            result = make_error(ErrorCode::internal, "the worker stopped: " + system.render(err));
          });
  return result;
}

// One replica: a worker loaded from `spec`, and the scheduler sized from its report.
Result<actors::replica_actor> start_replica(Engine::Impl& impl, const engine::WorkerSpec& spec,
                                            const EngineHooks& hooks) {
  auto worker = impl.system->spawn<caf::detached>(actors::worker, hooks.before_step);
  auto report = load_worker(*impl.system, worker, spec);
  if (!report) {
    caf::anon_send_exit(worker, caf::exit_reason::kill);
    return tl::unexpected(report.error());
  }
  impl.device_description = report->device_name;
  return impl.system->spawn(
      actors::scheduler, scheduler_config(impl.config, impl.max_model_len, report->num_kv_blocks),
      impl.tokenizer->vocabulary().end_of_generation, std::move(worker), spec, hooks.before_step,
      impl.config.metrics);
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  if (!impl_ || !impl_->system) return;
  caf::anon_send_exit(impl_->scheduler, caf::exit_reason::user_shutdown);
  impl_->scheduler = nullptr;
  impl_->system->await_all_actors_done();
  impl_->system.reset();
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  return create(config, EngineHooks{});
}

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config,
                                               const EngineHooks& hooks) {
  if (config.model_path.empty()) {
    return make_error(ErrorCode::invalid_argument, "no model path given");
  }
  if (config.block_size <= 0 || config.max_num_seqs <= 0 || config.max_num_batched_tokens <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "block_size, max_num_seqs and max_num_batched_tokens must be positive");
  }
  if (config.data_parallel_size < 1) {
    return make_error(ErrorCode::invalid_argument, "data_parallel_size must be at least 1");
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
  auto spec = worker::spec_for(config, config.model_path, impl->max_model_len);
  spec.model_fingerprint = model::file_fingerprint(*impl->model->file);

  // Blocking calls and cross-thread round trips are faster under the sharing policy.
  impl->actor_config.set("scheduler.policy", caf::atom("sharing"));
  actors::add_message_types(impl->actor_config);
  impl->system = std::make_unique<caf::actor_system>(impl->actor_config);
  const std::int32_t num_replicas = config.data_parallel_size;
  if (num_replicas > 1 && spec.num_threads == 0) {
    // Local replicas share the cores rather than each taking all of them.
    const auto cores = static_cast<std::int32_t>(std::max(1U, std::thread::hardware_concurrency()));
    spec.num_threads = std::max(1, cores / num_replicas);
  }
  std::vector<actors::replica_actor> replicas;
  for (std::int32_t i = 0; i < num_replicas; ++i) {
    auto replica = start_replica(*impl, spec, hooks);
    if (!replica) {
      for (auto& r : replicas) caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
      impl->system->await_all_actors_done();
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

  const RequestId id = impl.next_id.fetch_add(1);
  if (!request.params.seed && impl.config.seed) {
    request.params.seed = *impl.config.seed * 0x9e3779b97f4a7c15ULL + id;
  }
  auto setup = std::make_shared<actors::RequestSetup>();
  setup->id = id;
  setup->on_event = std::move(on_event);
  setup->tokenizer = impl.tokenizer;
  setup->stop = std::move(request.stop);
  setup->num_prompt_tokens = n;
  setup->timeout = request.timeout;
  setup->scheduler = impl.scheduler;
  setup->metrics = impl.config.metrics;
  setup->submitted = std::chrono::steady_clock::now();
  auto requester = impl.system->spawn(actors::request, setup);
  caf::anon_send(impl.scheduler, actors::submit_atom::value,
                 actors::Submission{id, std::move(request.prompt), request.params, request.priority,
                                    std::move(requester)});
  return id;
}

void Engine::cancel(RequestId id) {
  caf::anon_send(impl_->scheduler, actors::abort_atom::value, id, FinishReason::abort);
}

EngineStats Engine::stats() const {
  EngineStats result;
  caf::scoped_actor self{*impl_->system};
  self->request(impl_->scheduler, caf::infinite, actors::stats_atom::value)
      .receive([&](const EngineStats& s) { result = s; }, [](const caf::error&) {});
  result.num_live_actors = static_cast<std::int64_t>(impl_->system->registry().running());
  return result;
}

std::vector<ReplicaStats> Engine::replicas() const {
  std::vector<ReplicaStats> result;
  caf::scoped_actor self{*impl_->system};
  self->request(impl_->scheduler, caf::infinite, actors::replicas_atom::value)
      .receive([&](std::vector<ReplicaStats>& r) { result = std::move(r); },
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

const std::string& Engine::device_description() const {
  return impl_->device_description;
}

}  // namespace troupe
