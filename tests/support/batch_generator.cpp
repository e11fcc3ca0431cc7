#include "support/batch_generator.hpp"

#include <algorithm>
#include <future>
#include <memory>

#include "engine/engine_core.hpp"
#include "worker/worker.hpp"

namespace troupe::test {

Result<std::vector<GenerationResult>> BatchGenerator::run(
    const std::vector<GenerationRequest>& requests, std::int32_t prefill_chunk) {
  model::LlamaModel& model = *ranks_.front();
  const model::KvCacheShape& cache = model.backend().kv_cache_shape();
  const std::int32_t context = model.config().context_length;
  const auto n = static_cast<std::int32_t>(requests.size());
  std::int64_t prompt_tokens = 0;
  for (const auto& r : requests) {
    if (r.prompt.empty()) return make_error(ErrorCode::invalid_argument, "a prompt is empty");
    const auto length = static_cast<std::int64_t>(r.prompt.size()) + r.params.max_tokens;
    if (length > context) {
      return make_error(ErrorCode::out_of_range,
                        "prompt of " + std::to_string(r.prompt.size()) +
                            " tokens plus max_tokens " + std::to_string(r.params.max_tokens) +
                            " exceeds the context length of " + std::to_string(context));
    }
    prompt_tokens += static_cast<std::int64_t>(r.prompt.size());
  }
  std::vector<GenerationResult> results(requests.size());
  if (requests.empty()) return results;

  // Every sequence runs at once; a step takes each one's next prompt chunk, or one token.
  engine::SchedulerConfig config;
  config.num_blocks = cache.num_blocks;
  config.block_size = cache.block_size;
  config.max_model_len = context;
  config.max_num_seqs = n;
  config.max_num_batched_tokens =
      static_cast<std::int32_t>(prefill_chunk > 0 ? std::int64_t{prefill_chunk} * n
                                                  : std::max<std::int64_t>(prompt_tokens, n));
  config.enable_prefix_caching = false;
  config.speculation = speculation_;
  // A draft's tokens count in the step's budget: room for every sequence's.
  if (speculation_.enabled()) {
    config.max_num_batched_tokens += n * speculation_.num_speculative_tokens;
  }
  engine::EngineCore core(config, end_of_generation_);
  std::vector<std::unique_ptr<model::ModelRunner>> runners;
  for (model::LlamaModel* rank : ranks_) {
    runners.push_back(std::make_unique<model::ModelRunner>(*rank, end_of_generation_));
  }
  // The rank that samples: rank 0, of the last stage when the model is a pipeline.
  std::size_t sampling = 0;
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r]->shard().computes_logits()) sampling = r;
  }
  model::ModelRunner& runner = *runners[sampling];
  runner.set_logits_observer([&results](std::uint64_t id, std::span<const float> logits) {
    auto& first = results[id].first_logits;
    if (first.empty()) first.assign(logits.begin(), logits.end());
  });
  for (std::size_t i = 0; i < requests.size(); ++i) {
    TROUPE_TRY_VOID(
        core.add({i, requests[i].prompt, requests[i].params, 0, {}, requests[i].adapter}));
  }
  while (core.has_work()) {
    auto work = core.next_step();
    if (!work) {
      return make_error(ErrorCode::out_of_range, "the KV cache of " +
                                                     std::to_string(cache.num_blocks) +
                                                     " blocks cannot run these sequences");
    }
    // The other ranks (or stages) run the same step at the same time as the sampling one, a
    // thread each: every collective of the step waits until all the ranks have called it.
    std::vector<std::future<engine::StepOutput>> others;
    for (std::size_t r = 0; r < runners.size(); ++r) {
      if (r == sampling) continue;
      others.push_back(
          std::async(std::launch::async, [&, r] { return worker::run_step(*runners[r], *work); }));
    }
    const engine::StepOutput output = worker::run_step(runner, *work);
    for (auto& other : others) {
      const engine::StepOutput rank_output = other.get();
      if (rank_output.failed) return make_error(rank_output.error.code, rank_output.error.message);
    }
    if (output.failed) return make_error(output.error.code, output.error.message);
    for (const auto& update : core.apply(output).updates) {
      GenerationResult& result = results[update.id];
      if (update.token.id != kNoToken) result.output.push_back(update.token.id);
      if (update.finish_reason != FinishReason::none) result.finish_reason = update.finish_reason;
    }
  }
  last_spec_ = core.counters().spec;
  return results;
}

}  // namespace troupe::test
