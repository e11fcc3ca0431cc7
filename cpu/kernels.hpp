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

// The SIMD target the dispatcher picked, for logs and benchmarks.
const char* simd_target_name();

}  // namespace troupe::cpu
