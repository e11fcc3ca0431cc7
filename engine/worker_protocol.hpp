// What the engine core and its workers say to each other: plain values only (no
// pointers, no callbacks), so that a worker can live in another process. The actors
// give each of them a CAF inspect() and a type id (actors/wire.hpp); the cluster
// sends the same messages to workers on other nodes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/token_budget.hpp"
#include "model/draft_proposer.hpp"
#include "model/prompt_logprobs.hpp"
#include "model/sampler.hpp"
#include "model/step_input.hpp"
#include "troupe/result.hpp"
#include "troupe/sampling.hpp"
#include "troupe/stats.hpp"

namespace troupe::engine {

// Everything a worker needs to load its share of a model and size its KV cache.
struct WorkerSpec {
  std::string model_path;
  std::string model_fingerprint;  // model::file_fingerprint(): the worker checks its copy
  Device device = Device::cpu;
  std::int32_t device_index = 0;  // which GPU of its machine (a node gives each rank its own)
  std::int32_t num_threads = 0;   // compute threads (0: all cores)
  bool cuda_graphs = true;
  std::int32_t block_size = 16;
  std::int32_t max_model_len = 0;
  std::int32_t max_num_seqs = 256;
  std::int32_t max_num_batched_tokens = 2048;
  // The KV budget: num_kv_blocks when set; else a CPU's kv_cache_bytes, or a GPU's
  // gpu_memory_utilization of the memory its weights leave free.
  std::int32_t num_kv_blocks = 0;
  std::int64_t kv_cache_bytes = std::int64_t{1} << 30;
  double gpu_memory_utilization = 0.9;
  std::optional<KvCacheDtype> kv_cache_dtype;  // unset: F16
  std::int32_t rank = 0;
  std::int32_t world_size = 1;
  // A pipeline stage (pipeline_size > 1): stage `pipeline_stage` of `pipeline_size`, with the
  // layers `layer_partition` gives it (each stage's count in order; empty: balanced). Its
  // stages meet as a group's ranks do (on the pipe, rank i is stage i). With world_size > 1
  // too, the stage is a tensor-parallel group of its own, and each rank r has a pipe of its
  // own to rank r of the next stage.
  std::int32_t pipeline_stage = 0;
  std::int32_t pipeline_size = 1;
  std::vector<std::int32_t> layer_partition = {};
  // Time a prefill and a decode at load (LoadReport::step_costs), for a token budget
  // sized to the machine. A rank of a split model does not: its steps need the group.
  bool calibrate_step_cost = false;
  // Speculative decoding with a draft model: its file, loaded beside the model on the same
  // device, with a KV cache of its own under the same block ids. Empty: none.
  std::string draft_model_path;
  std::string draft_model_fingerprint;  // of the head's draft file; empty: not checked
  std::int32_t draft_num_threads = 0;   // its CPU threads, a pool of its own (0: the model's)
  // LoRA adapter files (llama.cpp's GGUF layout) for the model, attached in this order:
  // the i-th is slot i + 1 (CoreRequest::adapter). CPU only for now; each rank of a split
  // model keeps its part of every matrix.
  std::vector<std::string> lora_adapters = {};

  bool operator==(const WorkerSpec&) const = default;
};

// Why a worker could not do what it was asked.
struct WorkerError {
  ErrorCode code = ErrorCode::internal;
  std::string message;
  bool fatal = false;  // the worker's state is lost: it must be replaced

  bool operator==(const WorkerError&) const = default;
};

// A loaded worker's answer: what the scheduler is built from.
struct LoadReport {
  std::int32_t num_kv_blocks = 0;
  std::int64_t bytes_per_block = 0;
  std::int64_t weight_bytes = 0;  // the model's weights it holds (a group: all its ranks')
  std::string device_name;        // "CPU, 2 threads, SIMD AVX3", "CUDA NVIDIA H200 (...)"
  std::int32_t vocab_size = 0;
  bool failed = false;  // the model could not be loaded: why is in `error`
  WorkerError error;
  std::int32_t failed_rank = -1;     // a tensor-parallel group's rank that could not load
  std::vector<StepCost> step_costs;  // calibration steps, when the spec asked for them
  // What each worker holds (its rank, stage and layers; `node` empty): one, or a group's
  // ranks (a pipeline's stages) in order.
  std::vector<ReplicaWorker> parts = {};

  bool operator==(const LoadReport&) const = default;
};

// A sequence the worker has not seen (or must see again after a restart): its
// sampler is made from these. `generated`: the tokens it generated before (on a worker
// lost since, or on another replica: a resumed request), which the new sampler takes as
// its own (model::Sampler::resume) so that it draws on as the earlier one would have.
struct NewSequence {
  std::uint64_t id = 0;
  SamplingParams params;
  std::vector<TokenId> prompt;
  std::vector<TokenId> generated = {};

  bool operator==(const NewSequence&) const = default;
};

// One iteration's work.
struct StepWork {
  std::uint64_t step_id = 0;
  model::StepInput step;
  std::vector<std::uint64_t> sampled_ids;  // the sequence of each sampled logit row
  // The logit rows after the sampled ones: prompts to score (prompt_logprobs).
  std::vector<model::PromptRows> prompt_rows = {};
  // Speculative decoding: per sampled sequence, how many proposed tokens follow its
  // sampled row (each with a logit row of its own, right after it: the worker samples
  // them in order while the model agrees with the proposal). Empty: none in this step.
  std::vector<std::int32_t> num_drafts = {};
  // With a draft model, what it runs first: the sequences whose proposals it makes (their
  // drafts are placeholders in `step` until it has) and those it only catches up.
  std::vector<model::DraftWork> drafts = {};
  std::vector<NewSequence> new_sequences;
  std::vector<std::uint64_t> removed;  // ended since the last step: their samplers go

  bool operator==(const StepWork&) const = default;
};

// One iteration's result: one sampled token per sampled sequence and the scores of each
// StepWork::prompt_rows, or an error. With drafts, the tokens verification accepted
// after each sequence's first: num_more[i] of them for sampled sequence i, one after
// another in more_tokens (both empty when the step had no draft).
struct StepOutput {
  std::uint64_t step_id = 0;
  std::vector<model::SampledToken> tokens;
  std::vector<model::PromptLogprobs> prompt_logprobs = {};
  std::vector<std::int32_t> num_more = {};
  std::vector<model::SampledToken> more_tokens = {};
  bool failed = false;
  WorkerError error;
  double seconds = 0.0;  // in the worker
  // A pipeline's hops into its later stages, in seconds (LlamaModel::take_hop_seconds):
  // one a stage after the first, in stage order; empty for an unstaged worker.
  std::vector<double> hop_seconds = {};

  bool operator==(const StepOutput&) const = default;
};

// The output of a step that failed.
inline StepOutput failed_step(std::uint64_t step_id, WorkerError error) {
  StepOutput out;
  out.step_id = step_id;
  out.failed = true;
  out.error = std::move(error);
  return out;
}

}  // namespace troupe::engine
