#include "worker/worker.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>

#include "worker/backend_factory.hpp"
#include "worker/kv_sizing.hpp"

namespace troupe::worker {

namespace {

// Times a prefill of a few hundred tokens and a decode after it on a scratch sequence,
// so that a token budget sized to the machine starts from measurements. It runs before
// the engine hands out any block, so its KV slots are free again after it; its sampler
// goes. A first untimed token warms the weights (pages of a mapped file, caches).
Result<std::vector<engine::StepCost>> measure_step_costs(model::ModelRunner& runner,
                                                         const engine::WorkerSpec& spec,
                                                         std::int32_t num_blocks,
                                                         std::int32_t vocab_size) {
  constexpr std::uint64_t kScratch = ~std::uint64_t{0};
  const std::int32_t capacity = num_blocks * spec.block_size;
  const std::int32_t num_prefill =
      std::min({256, spec.max_num_batched_tokens, spec.max_model_len - 1, capacity - 1});
  if (num_prefill < 2) return std::vector<engine::StepCost>{};
  std::vector<TokenId> tokens(static_cast<std::size_t>(num_prefill) + 1);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<TokenId>((i * 7919 + 1) % static_cast<std::size_t>(vocab_size));
  }
  std::vector<std::int32_t> block_table((tokens.size() + spec.block_size - 1) / spec.block_size);
  for (std::size_t b = 0; b < block_table.size(); ++b)
    block_table[b] = static_cast<std::int32_t>(b);
  const std::span<const TokenId> all(tokens);
  TROUPE_TRY_VOID(runner.add_sequence(kScratch, SamplingParams{}, all.first(1)));
  const std::uint64_t sampled[] = {kScratch};
  auto run = [&](std::int32_t first, std::int32_t count) -> Result<double> {
    model::StepInput step;
    model::append_sequence(step, all.subspan(first, count), first, block_table, true);
    const auto start = std::chrono::steady_clock::now();
    TROUPE_TRY_VOID(runner.execute(step, sampled).map([](auto&&) {}));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto measured = [&]() -> Result<std::vector<engine::StepCost>> {
    TROUPE_TRY_VOID(run(0, 1).map([](double) {}));
    TROUPE_TRY(const double prefill, run(0, num_prefill));
    TROUPE_TRY(const double decode, run(num_prefill, 1));
    return std::vector<engine::StepCost>{{num_prefill, 0, prefill}, {1, 1, decode}};
  }();
  runner.remove_sequence(kScratch);
  return measured;
}

// What rank or stage 0 passes on of a step with a draft: the step's tokens (its
// placeholders filled in; token ids are exact in floats) and, last, whether its draft model
// succeeded (1), so that a failed draft fails the step on every worker that verifies.
std::vector<float> proposals_message(const model::StepInput& step, bool proposed) {
  std::vector<float> message(step.tokens.size() + 1, 0.0f);
  if (proposed) {
    for (std::size_t i = 0; i < step.tokens.size(); ++i) {
      message[i] = static_cast<float>(step.tokens[i]);
    }
    message.back() = 1.0f;
  }
  return message;
}

// The tokens of a proposals_message into `step`, or the failure of `who`'s draft model.
Result<void> take_proposals(std::span<const float> message, model::StepInput& step,
                            const std::string& who) {
  if (message.back() != 1.0f) {
    return make_error(ErrorCode::internal, who + "'s draft model failed to propose");
  }
  for (std::size_t i = 0; i < step.tokens.size(); ++i) {
    step.tokens[i] = static_cast<TokenId>(message[i]);
  }
  return {};
}

// A tensor-parallel group's ranks all verify rank 0's proposals: a sum over the group of
// rank 0's message, to which the others add nothing.
Result<void> share_proposals(model::Communicator& group, model::StepInput& step,
                             Result<void> proposed) {
  const bool first = group.rank() == 0;
  std::vector<float> shared = first ? proposals_message(step, proposed.has_value())
                                    : std::vector<float>(step.tokens.size() + 1, 0.0f);
  TROUPE_TRY_VOID(group.all_reduce_sum(shared));
  if (first) return proposed;
  return take_proposals(shared, step, "rank 0");
}

// A pipeline's stage 0 sends its proposals to the last stage, which verifies them (the
// stages between run hidden states only), over the pipe's pair of the two, in step order,
// before the step's hidden states.
Result<void> pass_proposals(model::Communicator& pipe, model::StepInput& step,
                            Result<void> proposed) {
  const std::int32_t last = pipe.size() - 1;
  if (pipe.rank() == 0) {
    TROUPE_TRY_VOID(pipe.send(proposals_message(step, proposed.has_value()), last));
    return proposed;
  }
  if (pipe.rank() != last) return {};
  std::vector<float> passed(step.tokens.size() + 1, 0.0f);
  TROUPE_TRY_VOID(pipe.recv(passed, 0));
  return take_proposals(passed, step, "stage 0");
}

}  // namespace

engine::StepOutput run_step(model::ModelRunner& runner, const engine::StepWork& work,
                            model::DraftProposer* draft, model::Communicator* group,
                            model::Communicator* pipe) {
  auto fail = [&work](Error error) {
    return engine::failed_step(work.step_id, {error.code, std::move(error.message), false});
  };
  for (std::uint64_t id : work.removed) runner.remove_sequence(id);
  std::optional<Error> refused;
  for (const auto& s : work.new_sequences) {
    if (auto added = runner.add_sequence(s.id, s.params, s.prompt, s.generated);
        !added && !refused) {
      refused = added.error();
    }
  }
  // The draft model fills in the proposals of a copy of the step; in a group, rank 0's
  // draft model, for every rank; in a pipeline, stage 0's, for the last stage.
  std::optional<model::StepInput> drafted;
  std::optional<Error> draft_failed;
  if (!work.drafts.empty()) {
    const bool passes = pipe != nullptr && pipe->size() > 1;
    // In a pipeline whose stages are groups, stage 0's ranks share (each embeds the tokens)
    // and each passes them on to its peer of the last stage.
    const bool shares = group != nullptr && group->size() > 1 && (!passes || pipe->rank() == 0);
    const bool proposes = (!shares || group->rank() == 0) && (!passes || pipe->rank() == 0);
    drafted = work.step;
    // A rank 0 without a draft model still shares (its failure): the others wait for it.
    Result<void> proposed;
    if (proposes && draft == nullptr) {
      proposed = make_error(ErrorCode::invalid_argument,
                            "the step asks for a draft model, and this worker has none");
    } else if (proposes) {
      // Outputs held to a grammar are guided by it, where this runner samples them (a
      // pipeline's stage 0 does not: its samplers never see the tokens).
      std::vector<std::optional<model::ProposalGuide>> guides;
      if (!passes) {
        for (const model::DraftWork& d : work.drafts) {
          guides.push_back(d.num_proposals > 0 ? runner.proposal_guide(d.id) : std::nullopt);
        }
      }
      proposed = draft->propose(work.drafts, *drafted, guides);
    }
    if (shares) proposed = share_proposals(*group, *drafted, std::move(proposed));
    if (passes) proposed = pass_proposals(*pipe, *drafted, std::move(proposed));
    if (!proposed && !passes) return fail(proposed.error());
    // A stage still runs its part of a failed step: the stages after it wait for its
    // hidden states.
    if (!proposed) {
      draft_failed = proposed.error();
      drafted = work.step;
    }
  }
  // Run even if a sampler was refused: a rank of a group that skipped its forward pass
  // would leave the others waiting in their collectives.
  std::vector<model::PromptLogprobs> prompt_scores;
  std::vector<std::vector<model::SampledToken>> more;
  auto tokens = runner.execute(drafted ? *drafted : work.step, work.sampled_ids, work.prompt_rows,
                               &prompt_scores, work.num_drafts, &more);
  if (draft_failed) return fail(std::move(*draft_failed));
  if (refused) return fail(std::move(*refused));
  if (!tokens) return fail(tokens.error());
  engine::StepOutput out;
  out.step_id = work.step_id;
  out.tokens = std::move(*tokens);
  out.prompt_logprobs = std::move(prompt_scores);
  if (!work.num_drafts.empty()) {
    for (auto& accepted : more) {
      out.num_more.push_back(static_cast<std::int32_t>(accepted.size()));
      for (auto& token : accepted) out.more_tokens.push_back(std::move(token));
    }
  }
  return out;
}

Result<std::unique_ptr<Worker>> Worker::load(const engine::WorkerSpec& spec, const GroupLink* link,
                                             const model::LoadProgress& progress) {
  if (spec.block_size <= 0 || spec.max_num_seqs <= 0 || spec.max_num_batched_tokens <= 0 ||
      spec.max_model_len <= 0) {
    return make_error(ErrorCode::invalid_argument,
                      "block_size, max_num_seqs, max_num_batched_tokens and max_model_len must "
                      "be positive");
  }
  std::unique_ptr<Worker> w(new Worker());
  w->device_ = spec.device;
  TROUPE_TRY(w->model_, open_model(spec, link, progress));
  auto& llama = *w->model_.model;
  auto& backend = *w->model_.backend;
  // Activations first (a step holds at most max_num_batched_tokens tokens, a decode batch
  // padded to its graph's size at most max_num_seqs), then the KV pool from what is left.
  TROUPE_TRY_VOID(
      llama.prepare(std::max(spec.max_num_batched_tokens, spec.max_num_seqs), spec.max_num_seqs));
  // Rank 0 of a group, stage 0 of a pipeline: the one that proposes.
  if (!spec.draft_model_path.empty() && spec.rank == 0 && spec.pipeline_stage == 0) {
    TROUPE_TRY_VOID(w->load_draft(spec));
  }
  // A draft model's cache has a block for each of the model's, under the same id.
  const auto shape = w->model_.kv_cache_shape(0, spec.block_size);
  std::int64_t block_bytes = backend.kv_block_bytes(shape);
  std::int64_t draft_block_bytes = 0;
  if (w->draft_.model) {
    draft_block_bytes =
        w->draft_.backend->kv_block_bytes(w->draft_.kv_cache_shape(0, spec.block_size));
    block_bytes += draft_block_bytes;
  }
  std::optional<std::int64_t> free_bytes;
  if (spec.device == Device::cuda && spec.num_kv_blocks <= 0) {
    TROUPE_TRY(free_bytes, backend.free_memory_bytes());
  }
  TROUPE_TRY(const std::int32_t num_blocks,
             kv_blocks_for_budget(spec, block_bytes, free_bytes, draft_block_bytes));
  TROUPE_TRY_VOID(w->model_.allocate_kv_cache(num_blocks, spec.block_size));
  if (w->draft_.model) {
    TROUPE_TRY_VOID(w->draft_.allocate_kv_cache(num_blocks, spec.block_size));
    w->proposer_ = std::make_unique<model::DraftProposer>(*w->draft_.model);
  }
  w->runner_ = std::make_unique<model::ModelRunner>(
      llama, w->model_.tokenizer->vocabulary().end_of_generation, w->model_.tokenizer.get());
  if (spec.calibrate_step_cost && spec.world_size == 1 && spec.pipeline_size <= 1) {
    // A calibration that fails costs only the measurement: the budget then starts from
    // its guess and learns from the first steps (a broken backend fails those anyway).
    auto costs = measure_step_costs(*w->runner_, spec, num_blocks, w->model_.config.vocab_size);
    if (costs) w->report_.step_costs = std::move(*costs);
  }
  w->report_.num_kv_blocks = num_blocks;
  w->report_.bytes_per_block = block_bytes;
  w->report_.weight_bytes =
      llama.weight_bytes() + (w->draft_.model ? w->draft_.model->weight_bytes() : 0);
  w->report_.device_name = backend.describe();
  w->report_.vocab_size = w->model_.config.vocab_size;
  const model::PipelineStage& stage = llama.shard().stage;
  ReplicaWorker part;
  part.rank = spec.world_size > 1 ? spec.rank : -1;
  part.stage = stage.is_staged() ? stage.index : -1;
  part.layer_begin = stage.layer_begin;
  part.layer_end = stage.layer_end > 0 ? stage.layer_end : w->model_.config.num_layers;
  w->report_.parts = {part};
  return w;
}

Result<void> Worker::set_adapter(std::int32_t slot, const std::string& path) {
  if (path.empty()) return model_.model->set_adapter(slot, nullptr);
  engine::WorkerSpec spec;
  spec.device = device_;
  TROUPE_TRY(auto adapter, read_adapter(model_, path));
  return model_.model->set_adapter(slot, std::move(adapter));
}

Result<void> Worker::load_draft(const engine::WorkerSpec& spec) {
  auto refused = [&](const std::string& why) {
    return make_error(ErrorCode::invalid_argument,
                      "the draft model " + spec.draft_model_path + " " + why);
  };
  // Rank 0 shares its proposals through host memory, which NCCL's collectives do not take.
  if (spec.world_size > 1 && spec.device != Device::cpu) {
    return refused("cannot run beside a model split over GPUs (not supported yet)");
  }
  // A tensor-parallel group's rank 0 alone runs the whole draft model (it is small): the
  // others take its proposals over the group, so every rank verifies the same tokens.
  engine::WorkerSpec draft_spec = spec;
  draft_spec.rank = 0;
  draft_spec.world_size = 1;
  draft_spec.pipeline_stage = 0;  // and a pipeline's stage 0 alone runs the whole draft
  draft_spec.pipeline_size = 1;
  draft_spec.layer_partition.clear();
  draft_spec.model_path = spec.draft_model_path;
  draft_spec.model_fingerprint = spec.draft_model_fingerprint;  // checked by open_model
  draft_spec.draft_model_path.clear();
  draft_spec.draft_model_fingerprint.clear();
  draft_spec.draft_num_threads = 0;
  draft_spec.lora_adapters.clear();  // the draft proposes with its own weights alone
  // The draft runs only between the model's steps: on the model's threads, or on a pool
  // of its own where the spec gives it a thread count.
  const bool own_threads = spec.device == Device::cpu && spec.draft_num_threads > 0;
  if (own_threads) draft_spec.num_threads = spec.draft_num_threads;
  // Its weights are mapped beside the model's: the two must fit in memory together.
  const std::int64_t beside =
      spec.device == Device::cpu
          ? model::tensor_bytes(*model_.file) /
                (std::max(1, spec.world_size) * std::max(1, spec.pipeline_size))
          : 0;
  auto draft =
      open_model(draft_spec, nullptr, {}, own_threads ? nullptr : model_.backend.get(), beside);
  if (!draft) return make_error(draft.error().code, "the draft model: " + draft.error().message);
  draft_ = std::move(*draft);
  // The same vocabulary: every id stands for the same bytes in both.
  const text::Tokenizer& mine = *model_.tokenizer;
  const text::Tokenizer& theirs = *draft_.tokenizer;
  // The sizes that differ: the logits' rows, or else the tokenizers' pieces.
  const bool rows_differ = draft_.config.vocab_size != model_.config.vocab_size;
  if (rows_differ || theirs.size() != mine.size()) {
    const auto size_of = [&](const model::LoadedModel& m, const text::Tokenizer& t) {
      return std::to_string(rows_differ ? static_cast<std::size_t>(m.config.vocab_size) : t.size());
    };
    return refused("has a vocabulary of " + size_of(draft_, theirs) + " tokens, the model " +
                   size_of(model_, mine) + ": a draft must share the model's vocabulary");
  }
  for (std::size_t id = 0; id < mine.size(); ++id) {
    const auto t = static_cast<TokenId>(id);
    if (mine.piece(t) != theirs.piece(t)) {
      return refused("has another vocabulary: token " + std::to_string(id) + " is \"" +
                     std::string(theirs.piece(t)) + "\" there, \"" + std::string(mine.piece(t)) +
                     "\" in the model");
    }
  }
  // Its passes hold at most a step's tokens (its catching up counts in the budget) and a
  // logit row per sequence.
  return draft_.model->prepare(std::max(spec.max_num_batched_tokens, spec.max_num_seqs),
                               spec.max_num_seqs);
}

engine::StepOutput Worker::step(const engine::StepWork& work) {
  const auto start = std::chrono::steady_clock::now();
  if (out_of_step_) {
    return engine::failed_step(work.step_id,
                               {ErrorCode::internal,
                                "an earlier step failed (" + *out_of_step_ +
                                    "): this worker is "
                                    "out of step with its group, and must be replaced",
                                true});
  }
  engine::StepOutput out;
  // A throwing step leaves the backend in an unknown state: the worker must go.
  try {
    if (before_step_) before_step_();
    out = run_step(*runner_, work, proposer_.get(), model_.group.get(), model_.pipe.get());
  } catch (const std::exception& e) {
    out = engine::failed_step(
        work.step_id, {ErrorCode::internal, std::string("the step failed: ") + e.what(), true});
  } catch (...) {
    out = engine::failed_step(
        work.step_id, {ErrorCode::internal, "the step failed with an unknown exception", true});
  }
  out.hop_seconds = model_.model->take_hop_seconds();
  // A group's ranks or a pipeline's stages may be out of step after a failure.
  const model::Shard& shard = model_.model->shard();
  if (out.failed && (shard.is_split() || shard.is_staged())) {
    out.error.fatal = true;
    out_of_step_ = out.error.message;
  }
  // A backend that is lost (a sticky CUDA error) fails every later step: replace it.
  if (out.failed && model_.backend->lost()) out.error.fatal = true;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace troupe::worker
