// Runs a fixed set of sequences to completion on one local model, through the
// engine's own step loop (engine::EngineCore) and worker step: the driver of the
// golden tests, which need neither actors nor a server. It also keeps each
// sequence's logits at its first generated position, for comparing with llama.cpp.
// The model may be a tensor-parallel group whose ranks are in this process: every
// step then runs on every rank at once (a thread each), and rank 0 samples; or a pipeline
// whose stages are in this process, and the last stage samples.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine_core.hpp"
#include "model/llama_model.hpp"
#include "troupe/sampling.hpp"

namespace troupe::test {

struct GenerationRequest {
  std::vector<TokenId> prompt;
  SamplingParams params;
  std::int32_t adapter = 0;  // the model's LoRA adapter slot (0: the base model)
};

struct GenerationResult {
  std::vector<TokenId> output;
  FinishReason finish_reason = FinishReason::none;
  std::vector<float> first_logits;  // [vocab] logits at the first generated position
};

class BatchGenerator {
 public:
  // The model's KV cache must be allocated; its blocks are the scheduler's pool.
  BatchGenerator(model::LlamaModel& model, std::vector<TokenId> end_of_generation)
      : ranks_{&model}, end_of_generation_(std::move(end_of_generation)) {}
  // The ranks of one group, rank 0 first (or a pipeline's stages, in any order), each with
  // its KV cache allocated; the one that computes logits samples.
  BatchGenerator(std::vector<model::LlamaModel*> ranks, std::vector<TokenId> end_of_generation)
      : ranks_(std::move(ranks)), end_of_generation_(std::move(end_of_generation)) {}

  // prefill_chunk: most prompt tokens per sequence per step (0: whole prompts).
  Result<std::vector<GenerationResult>> run(const std::vector<GenerationRequest>& requests,
                                            std::int32_t prefill_chunk = 0);

  // Speculative decoding for the runs from now on (off by default); the last run's counts.
  void set_speculation(const SpeculativeConfig& speculation) { speculation_ = speculation; }
  const engine::SpecDecodeCounters& last_speculation() const { return last_spec_; }

 private:
  SpeculativeConfig speculation_;
  engine::SpecDecodeCounters last_spec_;
  std::vector<model::LlamaModel*> ranks_;
  std::vector<TokenId> end_of_generation_;
};

}  // namespace troupe::test
