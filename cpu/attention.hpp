// The CPU's paged attention, made for long contexts. Each sequence's keys are cut
// into fixed partitions of whole blocks (flash-decoding). One partition yields, for
// each query head, the largest score m, the sum s of exp(score - m) and the
// unnormalized output o = sum of exp(score - m) * value; the partitions are then
// folded in ascending order. A query's result so depends only on its own keys: not
// on the batch, nor on the tile of queries it shares key loads with, nor on whether
// its partitions ran on one thread or on many.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/backend.hpp"

namespace troupe::cpu {

class ThreadPool;

// Keys per partition, rounded up to whole blocks.
inline constexpr std::int32_t kPartitionKeys = 256;
// Queries of one sequence that share each key block's load in a prefill.
inline constexpr std::int32_t kQueryTile = 16;

// One layer of a paged KV cache in host memory.
struct KvLayerView {
  const std::byte* keys = nullptr;    // [num_blocks, num_kv_heads, head_dim, block_size]
  const std::byte* values = nullptr;  // [num_blocks, num_kv_heads, block_size, head_dim]
  KvCacheDtype dtype = KvCacheDtype::f16;
  std::int32_t block_size = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
};

// out = causal attention of each of the step's queries over its sequence's keys (those
// inside params.window of it, when it has one). The step must have passed validate_step
// (a sequence's positions ascend, its blocks cover them).
//   q, out: [num_tokens, num_heads * head_dim]
void paged_attention(ThreadPool& pool, const model::StepInput& step, const KvLayerView& kv,
                     model::Tensor q, const model::AttentionParams& params, model::Tensor out);

// --- the kernel: one partition, dispatched to the best SIMD target ---

// One tile of consecutive queries of one sequence, the `group` query heads of one KV
// head, over one partition of that head's keys: keys [key_begin, key_begin +
// num_blocks * block_size), of which query i sees those up to positions[i] and, with a
// window, from positions[i] - window + 1 on.
struct PartitionJob {
  const float* q = nullptr;  // query i's heads at q + i * q_stride, head_dim apart
  std::int64_t q_stride = 0;
  std::int32_t num_queries = 0;
  const std::int32_t* positions = nullptr;  // [num_queries]
  std::int32_t group = 1;
  std::int32_t head_dim = 0;
  float scale = 1.0f;
  float softcap = 0.0f;     // score = softcap * tanh(scale * q.k / softcap); 0: none
  std::int32_t window = 0;  // 0: none
  KvCacheDtype dtype = KvCacheDtype::f16;
  const std::byte* const* k_blocks = nullptr;  // [num_blocks] one KV head's part of each block
  const std::byte* const* v_blocks = nullptr;
  std::int32_t num_blocks = 0;
  std::int32_t block_size = 0;
  std::int32_t key_begin = 0;
  float* scores = nullptr;        // scratch: num_queries * group rows of score_stride
  std::int64_t score_stride = 0;  // >= num_blocks * block_size rounded up to 16
  // Results per row r = i * group + h: m[r], s[r] (0 when the row sees no key here) and
  // o[r * head_dim, ...).
  float* m = nullptr;
  float* s = nullptr;
  float* o = nullptr;
};

void attention_partition(const PartitionJob& job);

// Folds one partition's (m, s, o) of a row into the running (m, s, o) of the partitions
// before it. The one fold every path takes, in ascending partition order.
void fold_partition(float& run_m, float& run_s, float* run_o, float m, float s, const float* o,
                    std::int32_t head_dim);

}  // namespace troupe::cpu
