// The CUDA kernels' launchers: plain functions over device pointers, so that
// only the .cu files go through nvcc and the backend stays ordinary C++.
// Every launcher enqueues on `stream` and returns without waiting.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/kernel_types.hpp"

namespace troupe::gpu::kernels {

// --- LoRA (lora.cu) ---
// One adapter group of a lora_add launch: A [rank, n_in] and B^T [rank, n_out], F16 or F32.
struct LoraGroupArgs {
  const void* a = nullptr;
  const void* b_t = nullptr;
  std::int32_t rank = 0;
  std::int32_t slot = 0;  // the rows whose row_slots entry is this take this group
  float scale = 0.0f;
  std::int32_t f16 = 0;  // else F32
};
inline constexpr int kLoraGroupsPerLaunch = 16;
// Passed by value (a kernel parameter): no upload between a step's many LoRA launches.
struct LoraLaunch {
  LoraGroupArgs groups[kLoraGroupsPerLaunch];
  std::int32_t num_groups = 0;
  std::int32_t n_in = 0, n_out = 0;
  std::int32_t ax_stride = 0;  // floats per row of the scratch `ax`: the largest rank at least
};
// y[r] += s * B (A x[r]) for every row r whose slot (row_slots[r]) is one of the launch's
// groups'; other rows are left alone. ax: [rows, ax_stride] scratch.
void lora_add(const float* x, float* y, std::int64_t rows, const std::int32_t* row_slots,
              const LoraLaunch& launch, float* ax, cudaStream_t stream);

// --- elementwise and row ops (kernels.cu) ---
// y[i] = (16-bit) x[i].
void cast_to_16(const float* x, void* y, Half16 type, std::int64_t n, cudaStream_t stream);
// y[i] = scale * uniform(-1, 1) (+ offset), from a counter-based hash of (seed, i): the
// benchmark's weights and KV contents, made on the device.
void fill_random_16(void* y, Half16 type, std::int64_t n, std::uint64_t seed, float scale,
                    cudaStream_t stream);
void fill_random_f32(float* y, std::int64_t n, std::uint64_t seed, float scale, float offset,
                     cudaStream_t stream);
// out[t] = table[tokens[t]] as float.                      table: [vocab, cols]
void embed(const std::int32_t* tokens, const void* table, Half16 type, std::int64_t cols,
           float* out, std::int64_t rows, cudaStream_t stream);
// out = x / rms(x) * w, per row; x may be out.
void rms_norm(const float* x, const float* w, float eps, float* out, std::int64_t rows,
              std::int64_t cols, Copy16 copy, cudaStream_t stream);
// x += y, then out = rms_norm(x).
void add_rms_norm(float* x, const float* y, const float* w, float eps, float* out,
                  std::int64_t rows, std::int64_t cols, Copy16 copy, cudaStream_t stream);
struct RopeArgs {
  std::int32_t head_dim = 0;
  std::int32_t num_heads = 0;
  std::int32_t rot_dims = 0;
  bool neox = false;
  float theta_scale = 1.0f;  // freq_base^(-2 / rot_dims)
  float freq_scale = 1.0f;
  const float* freq_factors = nullptr;  // [rot_dims / 2] or null
};
// RoPE on q ([rows, args.num_heads * head_dim]) and k ([rows, num_kv_heads * head_dim]),
// then k and v into their KV slots (cache layout per layer: [slots][kv_heads * head_dim] in
// half; slot -1 skips). One kernel serves the three ops: q null or num_heads 0 rotates no
// query, num_kv_heads 0 stores nothing, rot_dims 0 rotates nothing.
void rope_store_kv(float* q, float* k, const float* v, const std::int32_t* positions,
                   const std::int32_t* slots, std::int64_t rows, const RopeArgs& args,
                   std::int32_t num_kv_heads, void* k_cache, void* v_cache, cudaStream_t stream);
void swiglu(const float* gate, const float* up, float* out, std::int64_t n, Copy16 copy,
            cudaStream_t stream);
void add(float* x, const float* y, std::int64_t n, cudaStream_t stream);
// x[r * cols + c] += bias[c].                               x: [rows, cols], bias: [cols]
void add_bias(float* x, const float* bias, std::int64_t rows, std::int64_t cols,
              cudaStream_t stream);
// out = gelu_tanh(gate) * up, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_tanh_gate(const float* gate, const float* up, float* out, std::int64_t n, Copy16 copy,
                    cudaStream_t stream);
// x *= factor.
void scale(float* x, float factor, std::int64_t n, cudaStream_t stream);
// x = cap * tanh(x / cap).
void softcap(float* x, float cap, std::int64_t n, cudaStream_t stream);
// out[i] = x[rows[i]].
void gather_rows(const float* x, const std::int32_t* rows, float* out, std::int64_t num_rows,
                 std::int64_t cols, cudaStream_t stream);
// Poisons n floats with NaN (tests: unwritten outputs fail).
void fill_nan(float* x, std::int64_t n, cudaStream_t stream);

// --- attention (attention.cu) ---
struct AttentionArgs {
  const float* q = nullptr;       // [rows, num_heads * head_dim]
  float* out = nullptr;           // [rows, num_heads * head_dim]
  const void* k_cache = nullptr;  // one layer: [slots, num_kv_heads * head_dim] half
  const void* v_cache = nullptr;
  const std::int32_t* positions = nullptr;     // [rows]
  const std::int32_t* token_seq = nullptr;     // [rows], -1: padding (output zero)
  const std::int32_t* block_tables = nullptr;  // [seqs, block_stride]
  std::int32_t block_stride = 0;
  std::int32_t block_size = 0;
  std::int32_t num_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  float scale = 1.0f;
  float softcap = 0.0f;     // score = softcap * tanh(scale * q.k / softcap); 0: none
  std::int32_t window = 0;  // a query at p sees keys j with 0 <= p - j < window; 0: all
  Copy16 out16;             // also the output in 16 bits, for the matmul that reads it next
  std::int32_t partition = kDecodePartition;  // keys a decode split covers, at most that
};
// One query per listed row, over its sequence's blocks, split along the context into
// `num_splits` partitions (partials in `scratch`: rows * num_heads * num_splits * (head_dim + 2)
// floats), then combined.
void paged_attention_decode(const AttentionArgs& args, const std::int32_t* decode_rows,
                            std::int32_t num_decode_rows, std::int32_t num_splits, float* scratch,
                            cudaStream_t stream);
// Causal attention of each tile's queries over their sequence's blocks, FlashAttention-style
// (key tiles in shared memory, online softmax).
// With `tensor_cores` (and head_dim a multiple of 16) Q K^T and P V run as half-precision
// WMMA products; otherwise as float FMAs.
void prefill_attention(const AttentionArgs& args, const PrefillTile* tiles, std::int32_t num_tiles,
                       bool tensor_cores, cudaStream_t stream);
// Raises the prefill kernel's shared-memory limit for large heads; once per device.
cudaError_t prepare_attention();

// --- sampling (sampling.cu) ---
struct SamplingRowArgs {
  float temperature;
  std::int32_t top_k;
  float top_p;
  float min_p;
  std::uint64_t seed;
  std::uint64_t counter;
  std::int32_t masked;  // 1: the row's bitmask in `masks` holds its allowed tokens
};
// One token per row of logits [rows, vocab]: greedy, or temperature with top-k, top-p and
// min-p, drawn from a counter-based generator keyed by (seed, counter). A masked row's
// logits outside its bitmask (masks [rows, (vocab + 63) / 64]; bit t % 64 of word t / 64)
// are set to -inf first; `masks` may be null when no row is masked.
void sample(float* logits, std::int64_t rows, std::int32_t vocab, const SamplingRowArgs* params,
            const std::uint64_t* masks, std::int32_t* ids, cudaStream_t stream);

}  // namespace troupe::gpu::kernels
