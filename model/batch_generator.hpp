// Runs a fixed set of sequences to completion together through the batched,
// paged forward pass: all prompts prefill (in chunks), then every unfinished
// sequence decodes one token per step. Each sequence owns a fixed run of KV
// blocks. It is the model core's own driver (golden tests, without engine or
// actors); the serving engine schedules with engine/ instead.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/llama_model.hpp"
#include "model/sampler.hpp"
#include "troupe/sampling.hpp"

namespace troupe::model {

struct GenerationRequest {
  std::vector<TokenId> prompt;
  SamplingParams params;
};

struct GenerationResult {
  std::vector<TokenId> output;
  FinishReason finish_reason = FinishReason::none;
  std::vector<float> first_logits;  // [vocab] logits at the first generated position
};

struct GenerationStats {
  std::int64_t num_prompt_tokens = 0;
  std::int64_t num_generated_tokens = 0;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  std::int64_t num_steps = 0;
};

class BatchGenerator {
 public:
  // Called for each sampled token: (request index, token).
  using TokenCallback = std::function<void(std::size_t, const SampledToken&)>;

  BatchGenerator(LlamaModel& model, std::vector<TokenId> end_of_generation)
      : model_(model), end_of_generation_(std::move(end_of_generation)) {}

  // Blocks needed to run `requests` (the caller allocates the KV cache).
  static std::int32_t blocks_needed(const std::vector<GenerationRequest>& requests,
                                    std::int32_t block_size);

  // prefill_chunk: most prompt tokens per sequence per step (0: whole prompts).
  Result<std::vector<GenerationResult>> run(const std::vector<GenerationRequest>& requests,
                                            std::int32_t prefill_chunk = 0,
                                            const TokenCallback& on_token = {},
                                            GenerationStats* stats = nullptr);

 private:
  LlamaModel& model_;
  std::vector<TokenId> end_of_generation_;
};

}  // namespace troupe::model
