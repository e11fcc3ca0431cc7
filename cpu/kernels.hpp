// The CPU's SIMD kernels (Highway, dispatched at run time to the best target
// this processor has). Each dot product is computed by one fixed sequence of
// operations whatever the tile it sits in, so a row's result never depends on
// how many other rows share the call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gguf/tensor_type.hpp"

namespace troupe::cpu {

// Elements per quantization block of the int8 activations (as Q8_0's).
inline constexpr std::int64_t kQ8Block = 32;

// out[t * out_stride + r] = dot(x[t], w[r]) for t < num_x, r < num_w, with
// float32 activations and F32, F16 or BF16 weight rows.
//   x: [num_x, cols] floats, row stride x_stride; w: [num_w] rows of w_row_bytes
void matmul_tile_float(gguf::TensorType type, const float* x, std::int64_t x_stride,
                       std::int64_t num_x, const std::byte* w, std::size_t w_row_bytes,
                       std::int64_t num_w, std::int64_t cols, float* out, std::int64_t out_stride);

// Quantizes n floats (n % 32 == 0) to int8 with one scale per block of 32, as
// Int8RowBuffer does for the int8 kernels (tests build their references with it).
void quantize_row_q8(const float* x, std::int64_t n, std::int8_t* q, float* d);

// Int8RowBuffer::quantize_row (int8_matmul.hpp): cols floats (cols % 32 == 0) to int8 with
// one scale per 32 (spread over its 8 lanes of 4), the scaled and the exact sums of each 16.
void quantize_row_int8(const float* x, std::int64_t cols, std::int8_t* q, float* lane_scales,
                       float* sums, std::int32_t* int_sums);

// out = silu(gate) * up over n values (out may be gate), vectorised.
void swiglu_row_simd(const float* gate, const float* up, float* out, std::int64_t n);

// out[i] = gguf::f32_to_f16_saturated(in[i]) for i < n, vectorised (the KV cache's stores).
void f32_to_f16_saturated_row(const float* in, std::uint16_t* out, std::int64_t n);

// LoRA's expansion for num_rows rows (cpu_backend_lora.cpp): y[t][j] += scale * sum_k
// ax[t * rank + k] * b_t[k * n_out + j] for j in [j_begin, j_end), over B transposed
// ([rank][n_out]) so that columns are vector lanes and can be shared out. Each element is one
// chain of fused multiply-adds in k's order, so a row's result never depends on the rows
// beside it. (The shrinking A x is matmul_tile_float's, over A as stored.)
// b_t's elements are `type`'s: F32 or F16.
void lora_expand(gguf::TensorType type, const float* ax, std::int64_t num_rows, std::int64_t rank,
                 const std::byte* b_t, std::int64_t n_out, std::int64_t j_begin, std::int64_t j_end,
                 float scale, float* const* y);

// The SIMD target the dispatcher picked, for logs and benchmarks.
const char* simd_target_name();

}  // namespace troupe::cpu
