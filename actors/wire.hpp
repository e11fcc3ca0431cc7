// How the actors' messages cross a process: a CAF 0.17 inspect() for each plain value
// the worker protocol, the scheduler and the request actors exchange, and the names
// they are registered under (both ends of a connection must register them).
#pragma once

#include <caf/all.hpp>
#include <optional>

#include "engine/engine_core.hpp"
#include "engine/worker_protocol.hpp"
#include "troupe/engine.hpp"

namespace troupe {

namespace wire {

// std::optional as a flag and a value (CAF 0.17 knows only its own optional).
template <class T>
struct OptionalField {
  std::optional<T>& target;
  bool has = false;
  T value{};
  explicit OptionalField(std::optional<T>& t)
      : target(t), has(t.has_value()), value(t.value_or(T{})) {}
  caf::error store() {
    target = has ? std::optional<T>(value) : std::nullopt;
    return caf::none;
  }
};

}  // namespace wire

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SamplingParams& x) {
  wire::OptionalField<std::uint64_t> seed(x.seed);
  wire::OptionalField<std::int32_t> logprobs(x.logprobs);
  wire::OptionalField<std::int32_t> prompt_logprobs(x.prompt_logprobs);
  auto load = caf::meta::load_callback([&]() -> caf::error {
    seed.store();
    logprobs.store();
    return prompt_logprobs.store();
  });
  return f(caf::meta::type_name("troupe.SamplingParams"), x.temperature, x.top_k, x.top_p, x.min_p,
           seed.has, seed.value, x.repetition_penalty, x.presence_penalty, x.frequency_penalty,
           logprobs.has, logprobs.value, x.max_tokens, x.min_tokens, x.stop_token_ids, x.ignore_eos,
           x.grammar, x.logit_bias, prompt_logprobs.has, prompt_logprobs.value, x.grammar_after,
           load);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TokenLogprob& x) {
  return f(caf::meta::type_name("troupe.TokenLogprob"), x.id, x.logprob);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PromptLogprob& x) {
  return f(caf::meta::type_name("troupe.PromptLogprob"), x.token, x.logprob, x.rank,
           x.top_logprobs);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EngineStats& x) {
  return f(caf::meta::type_name("troupe.EngineStats"), x.num_running, x.num_waiting, x.kv_usage,
           x.peak_kv_usage, x.num_preemptions, x.prefix_queried_tokens, x.prefix_hit_tokens,
           x.num_steps, x.num_step_tokens, x.num_step_sequences, x.step_seconds, x.schedule_seconds,
           x.num_worker_restarts, x.num_live_actors, x.num_kv_blocks, x.block_size,
           x.prefix_cache_blocks, x.num_decode_steps, x.decode_step_seconds, x.num_prompt_tokens,
           x.num_generated_tokens, x.spec_num_drafts, x.spec_num_draft_tokens,
           x.spec_num_accepted_tokens, x.spec_num_accepted_tokens_per_pos);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaWorker& x) {
  return f(caf::meta::type_name("troupe.ReplicaWorker"), x.node, x.rank, x.stage, x.layer_begin,
           x.layer_end);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaStats& x) {
  return f(caf::meta::type_name("troupe.ReplicaStats"), x.index, x.up, x.state, x.node,
           x.num_routed, x.num_prefix_routed, x.stats, x.workers);
}

namespace model {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepInput& x) {
  return f(caf::meta::type_name("troupe.StepInput"), x.tokens, x.positions, x.query_start,
           x.context_lens, x.max_blocks_per_seq, x.block_tables, x.logit_rows, x.adapters);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SampledToken& x) {
  return f(caf::meta::type_name("troupe.SampledToken"), x.id, x.logprob, x.top_logprobs, x.error);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PromptRows& x) {
  return f(caf::meta::type_name("troupe.PromptRows"), x.id, x.first_position, x.top_n, x.targets);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DraftWork& x) {
  return f(caf::meta::type_name("troupe.DraftWork"), x.seq, x.first_position, x.tokens,
           x.num_proposals, x.id);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PromptLogprobs& x) {
  return f(caf::meta::type_name("troupe.PromptLogprobs"), x.id, x.first_position, x.entries);
}

}  // namespace model

namespace engine {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerSpec& x) {
  wire::OptionalField<KvCacheDtype> kv_cache_dtype(x.kv_cache_dtype);
  auto load = caf::meta::load_callback([&]() -> caf::error { return kv_cache_dtype.store(); });
  return f(caf::meta::type_name("troupe.WorkerSpec"), x.model_path, x.model_fingerprint, x.device,
           x.num_threads, x.cuda_graphs, x.block_size, x.max_model_len, x.max_num_seqs,
           x.max_num_batched_tokens, x.num_kv_blocks, x.kv_cache_bytes, x.gpu_memory_utilization,
           x.rank, x.world_size, x.device_index, kv_cache_dtype.has, kv_cache_dtype.value,
           x.calibrate_step_cost, x.draft_model_path, x.draft_model_fingerprint,
           x.draft_num_threads, x.lora_adapters, x.pipeline_stage, x.pipeline_size,
           x.layer_partition, load);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepCost& x) {
  return f(caf::meta::type_name("troupe.StepCost"), x.num_tokens, x.num_decodes, x.seconds);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, WorkerError& x) {
  return f(caf::meta::type_name("troupe.WorkerError"), x.code, x.message, x.fatal);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadReport& x) {
  return f(caf::meta::type_name("troupe.LoadReport"), x.num_kv_blocks, x.bytes_per_block,
           x.weight_bytes, x.device_name, x.vocab_size, x.failed, x.error, x.failed_rank,
           x.step_costs, x.parts);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NewSequence& x) {
  return f(caf::meta::type_name("troupe.NewSequence"), x.id, x.params, x.prompt, x.generated);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepWork& x) {
  return f(caf::meta::type_name("troupe.StepWork"), x.step_id, x.step, x.sampled_ids,
           x.new_sequences, x.removed, x.prompt_rows, x.num_drafts, x.drafts);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RequestEvent& x) {
  return f(caf::meta::type_name("troupe.RequestEvent"), x.id, x.token, x.finish_reason, x.error,
           x.error_code, x.num_cached_tokens, x.first_scheduled, x.prompt_logprobs);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepOutput& x) {
  return f(caf::meta::type_name("troupe.StepOutput"), x.step_id, x.tokens, x.failed, x.error,
           x.seconds, x.prompt_logprobs, x.num_more, x.more_tokens, x.hop_seconds);
}

}  // namespace engine

namespace actors {

// Registers every message type under its wire name (on both ends of a connection).
void add_message_types(caf::actor_system_config& config);

}  // namespace actors

}  // namespace troupe
