// One model iteration's input: tokens of many sequences flattened into one
// batch (selective batching), with what attention needs to find each
// sequence's KV blocks. The engine builds it; every backend reads it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "troupe/result.hpp"
#include "troupe/types.hpp"

namespace troupe::model {

constexpr std::int64_t kv_element_bytes(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::f32 ? 4 : 2;
}

struct KvCacheShape {
  std::int32_t num_layers = 0;
  std::int32_t num_blocks = 0;
  std::int32_t block_size = 16;  // tokens per block
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  KvCacheDtype dtype = KvCacheDtype::f16;
};

struct StepInput {
  std::vector<TokenId> tokens;             // [num_tokens] the flat batch, sequence after sequence
  std::vector<std::int32_t> positions;     // [num_tokens] each token's position in its sequence
  std::vector<std::int32_t> query_start;   // [num_seqs + 1] offsets into the flat batch
  std::vector<std::int32_t> context_lens;  // [num_seqs] KV length once this step's tokens are in
  std::int32_t max_blocks_per_seq = 0;
  std::vector<std::int32_t> block_tables;  // [num_seqs, max_blocks_per_seq] KV block ids
  std::vector<std::int32_t> logit_rows;    // [num_logits] flat-batch rows whose logits are wanted
  // [num_seqs] the LoRA adapter slot each sequence's rows run with
  // (LlamaModel::attach_adapter), 0 for the base model; empty: every row runs the base model.
  std::vector<std::int32_t> adapters;

  std::int32_t num_tokens() const { return static_cast<std::int32_t>(tokens.size()); }
  std::int32_t num_seqs() const { return static_cast<std::int32_t>(context_lens.size()); }
  std::span<const std::int32_t> block_table(std::int32_t seq) const {
    return {block_tables.data() + static_cast<std::size_t>(seq) * max_blocks_per_seq,
            static_cast<std::size_t>(max_blocks_per_seq)};
  }

  bool operator==(const StepInput&) const = default;
};

// Checks that a step is self-consistent and fits the cache and vocabulary, so a
// backend can index with it blindly.
Result<void> validate_step(const StepInput& step, const KvCacheShape& cache,
                           std::int32_t vocab_size);

// Appends one sequence to a step: `tokens` at positions [first_position, ...),
// with its block table (which must cover every position up to the new end).
// Marks the last token for logits when `wants_logits`. `adapter`: its LoRA adapter slot.
void append_sequence(StepInput& step, std::span<const TokenId> tokens, std::int32_t first_position,
                     std::span<const std::int32_t> block_table, bool wants_logits,
                     std::int32_t adapter = 0);

}  // namespace troupe::model
