#include "model/batch_generator.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace troupe::model {

namespace {

struct Sequence {
  std::vector<TokenId> tokens;  // prompt, then generated tokens
  std::int32_t num_prompt = 0;
  std::int32_t num_computed = 0;  // tokens whose KV is in the cache
  std::vector<std::int32_t> block_table;
  Sampler sampler;
  bool finished = false;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

std::int32_t BatchGenerator::blocks_needed(const std::vector<GenerationRequest>& requests,
                                           std::int32_t block_size) {
  std::int32_t total = 0;
  for (const auto& r : requests) {
    const auto length = static_cast<std::int32_t>(r.prompt.size()) + r.params.max_tokens;
    total += (length + block_size - 1) / block_size;
  }
  return total;
}

Result<std::vector<GenerationResult>> BatchGenerator::run(
    const std::vector<GenerationRequest>& requests, std::int32_t prefill_chunk,
    const TokenCallback& on_token, GenerationStats* stats) {
  const KvCacheShape& cache = model_.backend().kv_cache_shape();
  const std::int32_t vocab = model_.config().vocab_size;
  if (blocks_needed(requests, cache.block_size) > cache.num_blocks) {
    return make_error(ErrorCode::out_of_range, "the KV cache has " +
                                                   std::to_string(cache.num_blocks) +
                                                   " blocks, fewer than these sequences need");
  }
  std::vector<Sequence> seqs;
  seqs.reserve(requests.size());
  std::int32_t next_block = 0;
  for (const auto& r : requests) {
    if (r.prompt.empty()) return make_error(ErrorCode::invalid_argument, "a prompt is empty");
    const auto length = static_cast<std::int64_t>(r.prompt.size()) + r.params.max_tokens;
    if (length > model_.config().context_length) {
      return make_error(ErrorCode::out_of_range,
                        "prompt of " + std::to_string(r.prompt.size()) +
                            " tokens plus max_tokens " + std::to_string(r.params.max_tokens) +
                            " exceeds the context length of " +
                            std::to_string(model_.config().context_length));
    }
    TROUPE_TRY(auto sampler, Sampler::create(r.params, r.prompt, end_of_generation_, vocab));
    Sequence s{r.prompt, static_cast<std::int32_t>(r.prompt.size()), 0, {}, std::move(sampler),
               false};
    const auto num_blocks =
        static_cast<std::int32_t>((length + cache.block_size - 1) / cache.block_size);
    s.block_table.resize(num_blocks);
    std::iota(s.block_table.begin(), s.block_table.end(), next_block);
    next_block += num_blocks;
    seqs.push_back(std::move(s));
  }

  std::vector<GenerationResult> results(requests.size());
  std::vector<float> logits;
  StepInput step;
  std::vector<std::size_t> sampled;  // which sequence each logit row belongs to
  while (true) {
    // One step: every unfinished sequence contributes its next chunk of prompt, or one token.
    step = StepInput{};
    sampled.clear();
    bool prefilling = false;
    std::int64_t prompt_tokens_in_step = 0;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = seqs[i];
      if (s.finished) continue;
      std::int32_t n = static_cast<std::int32_t>(s.tokens.size()) - s.num_computed;
      if (prefill_chunk > 0) n = std::min(n, prefill_chunk);
      const bool reaches_end = s.num_computed + n == static_cast<std::int32_t>(s.tokens.size());
      if (s.num_computed < s.num_prompt) {
        prefilling = true;
        prompt_tokens_in_step += std::min(n, s.num_prompt - s.num_computed);
      }
      append_sequence(step, std::span(s.tokens).subspan(s.num_computed, n), s.num_computed,
                      s.block_table, reaches_end);
      if (reaches_end) sampled.push_back(i);
    }
    if (step.num_seqs() == 0) break;
    const auto start = std::chrono::steady_clock::now();
    TROUPE_TRY_VOID(model_.forward(step, logits));
    std::size_t seq_index = 0;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].finished) continue;
      seqs[i].num_computed += step.query_start[seq_index + 1] - step.query_start[seq_index];
      ++seq_index;
    }
    for (std::size_t row = 0; row < sampled.size(); ++row) {
      Sequence& s = seqs[sampled[row]];
      const std::span<const float> row_logits(logits.data() + row * vocab, vocab);
      GenerationResult& result = results[sampled[row]];
      if (result.first_logits.empty())
        result.first_logits.assign(row_logits.begin(), row_logits.end());
      const SampledToken token = s.sampler.sample(row_logits);
      s.tokens.push_back(token.id);
      result.output.push_back(token.id);
      if (on_token) on_token(sampled[row], token);
      if (s.sampler.finish_reason() != FinishReason::none) {
        s.finished = true;
        result.finish_reason = s.sampler.finish_reason();
      }
    }
    if (stats != nullptr) {
      const double elapsed = seconds_since(start);
      (prefilling ? stats->prefill_seconds : stats->decode_seconds) += elapsed;
      ++stats->num_steps;
      stats->num_prompt_tokens += prompt_tokens_in_step;
      stats->num_generated_tokens += static_cast<std::int64_t>(sampled.size());
    }
  }
  return results;
}

}  // namespace troupe::model
