// Engine: the C++ API over the actors. It loads the model, starts the
// scheduler actor (which starts the worker), and turns calls into messages.
#include "troupe/engine.hpp"

#include <atomic>

#include "actors/backends.hpp"
#include "actors/messages.hpp"
#include "actors/request_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/worker_actor.hpp"
#include "model/llama_config.hpp"
#include "model/sampler.hpp"
#include "model/tokenizer.hpp"

namespace troupe {

struct Engine::Impl {
  EngineConfig config;
  std::shared_ptr<const model::GgufFile> file;
  std::shared_ptr<const model::Tokenizer> tokenizer;
  model::LlamaConfig model_config;
  std::int32_t max_model_len = 0;
  std::int32_t num_kv_blocks = 0;
  std::string chat_template;
  std::string device_description;
  caf::actor_system_config actor_config;
  std::unique_ptr<caf::actor_system> system;
  actors::scheduler_actor scheduler;
  std::atomic<RequestId> next_id{1};
};

namespace {

// A pool of `blocks` must hold one whole sequence of max_model_len tokens.
Result<std::int32_t> checked_blocks(std::int64_t blocks, const EngineConfig& config,
                                    std::int32_t max_model_len) {
  const std::int64_t needed = (max_model_len + config.block_size - 1) / config.block_size;
  if (blocks < needed) {
    return make_error(ErrorCode::out_of_range,
                      "the KV cache of " + std::to_string(blocks) + " blocks of " +
                          std::to_string(config.block_size) +
                          " tokens cannot hold one sequence of " + std::to_string(max_model_len) +
                          " tokens: give it more memory or lower max_model_len");
  }
  return static_cast<std::int32_t>(std::min<std::int64_t>(blocks, 1 << 30));
}

// A CPU pool: num_kv_blocks, or as many as kv_cache_bytes holds.
Result<std::int32_t> kv_blocks_for(const EngineConfig& config, const model::LlamaConfig& c,
                                   std::int32_t max_model_len) {
  std::int64_t blocks = config.num_kv_blocks;
  if (blocks <= 0) {
    // Keys and values, float32, every layer.
    const std::int64_t bytes_per_block = std::int64_t{2} * c.num_layers * c.num_kv_heads *
                                         c.head_dim * config.block_size * sizeof(float);
    blocks = config.kv_cache_bytes / bytes_per_block;
  }
  return checked_blocks(blocks, config, max_model_len);
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
  if (config.model_path.empty()) {
    return make_error(ErrorCode::invalid_argument, "no model path given");
  }
  if (config.block_size <= 0 || config.max_num_seqs <= 0 || config.max_num_batched_tokens <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "block_size, max_num_seqs and max_num_batched_tokens must be positive");
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  TROUPE_TRY(auto file, model::GgufFile::open(config.model_path));
  impl->file = std::make_shared<const model::GgufFile>(std::move(file));
  TROUPE_TRY(auto tokenizer, model::Tokenizer::from_gguf(*impl->file));
  impl->tokenizer = std::make_shared<const model::Tokenizer>(std::move(tokenizer));
  TROUPE_TRY(impl->model_config, model::LlamaConfig::from_gguf(*impl->file));
  if (impl->file->find("tokenizer.chat_template") != nullptr) {
    TROUPE_TRY(const auto chat_template, impl->file->get_string("tokenizer.chat_template"));
    impl->chat_template = std::string(chat_template);
  }
  const auto& mc = impl->model_config;
  impl->max_model_len = config.max_model_len > 0 ? config.max_model_len : mc.context_length;
  if (impl->max_model_len > mc.context_length) {
    return make_error(ErrorCode::invalid_argument, "max_model_len " +
                                                       std::to_string(impl->max_model_len) +
                                                       " exceeds the model's context length of " +
                                                       std::to_string(mc.context_length));
  }
  // A CPU cache is sized from kv_cache_bytes now; a GPU's by the first worker, from the
  // memory its weights leave (the workers after it reuse that size).
  const bool sized_by_worker = config.device == Device::cuda && config.num_kv_blocks <= 0;
  if (!sized_by_worker) {
    TROUPE_TRY(impl->num_kv_blocks, kv_blocks_for(config, mc, impl->max_model_len));
  }

  auto file_ref = impl->file;
  auto eog = impl->tokenizer->vocabulary().end_of_generation;
  auto num_blocks = std::make_shared<std::int32_t>(impl->num_kv_blocks);
  const std::int32_t max_model_len = impl->max_model_len;
  actors::WorkerFactory make_worker =
      [file_ref, eog, config, num_blocks,
       max_model_len]() -> Result<std::unique_ptr<actors::WorkerResources>> {
    auto r = std::make_unique<actors::WorkerResources>();
    r->file = file_ref;
    TROUPE_TRY(r->backend, actors::make_backend(config, max_model_len));
    TROUPE_TRY(auto llama, model::LlamaModel::load(*r->file, *r->backend));
    r->model = std::make_unique<model::LlamaModel>(std::move(llama));
    const auto& c = r->model->config();
    TROUPE_TRY_VOID(actors::check_model(config, c));
    // Activations first (a step holds at most max_num_batched_tokens tokens, a decode batch
    // padded to its graph's size at most max_num_seqs), then the KV pool from what is left.
    TROUPE_TRY_VOID(r->model->prepare(std::max(config.max_num_batched_tokens, config.max_num_seqs),
                                      config.max_num_seqs));
    model::KvCacheShape shape{c.num_layers, *num_blocks, config.block_size, c.num_kv_heads,
                              c.head_dim};
    if (*num_blocks <= 0) {
      TROUPE_TRY(const std::int32_t fit,
                 actors::gpu_kv_blocks_that_fit(config, *r->backend, shape));
      TROUPE_TRY(*num_blocks, checked_blocks(fit, config, max_model_len));
      shape.num_blocks = *num_blocks;
    }
    TROUPE_TRY_VOID(r->backend->allocate_kv_cache(shape));
    r->runner = std::make_unique<model::ModelRunner>(*r->model, eog);
    return r;
  };
  TROUPE_TRY(auto first, make_worker());
  impl->device_description = first->backend->describe();
  impl->num_kv_blocks = *num_blocks;
  if (first->model->config().vocab_size != static_cast<std::int32_t>(impl->tokenizer->size())) {
    return make_error(ErrorCode::invalid_file,
                      "the tokenizer and the embedding disagree on the vocabulary size");
  }

  engine::SchedulerConfig sc;
  sc.max_num_batched_tokens = config.max_num_batched_tokens;
  sc.max_num_seqs = config.max_num_seqs;
  sc.max_model_len = impl->max_model_len;
  sc.num_blocks = impl->num_kv_blocks;
  sc.block_size = config.block_size;
  sc.enable_prefix_caching = config.enable_prefix_caching;
  sc.policy = config.policy == BatchingPolicy::priority ? engine::SchedulingPolicy::priority
                                                        : engine::SchedulingPolicy::fcfs;
  sc.mode = config.mode == BatchingMode::static_batch ? engine::BatchingMode::static_batch
                                                      : engine::BatchingMode::continuous;

  // Blocking calls and cross-thread round trips are faster under the sharing policy.
  impl->actor_config.set("scheduler.policy", caf::atom("sharing"));
  impl->system = std::make_unique<caf::actor_system>(impl->actor_config);
  auto holder = std::make_shared<std::unique_ptr<actors::WorkerResources>>(std::move(first));
  impl->scheduler = impl->system->spawn(actors::scheduler, sc, holder, make_worker,
                                        config.before_step, config.metrics);
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
                                    std::move(requester), setup->submitted});
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

const model::Tokenizer& Engine::tokenizer() const {
  return *impl_->tokenizer;
}
const model::LlamaConfig& Engine::model_config() const {
  return impl_->model_config;
}
std::int32_t Engine::max_model_len() const {
  return impl_->max_model_len;
}

}  // namespace troupe

namespace troupe {

const std::string& Engine::chat_template() const {
  return impl_->chat_template;
}

const std::string& Engine::device_description() const {
  return impl_->device_description;
}

}  // namespace troupe
