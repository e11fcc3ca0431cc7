// Plain scalar decoding of ggml tensor rows to float32: the reference every
// SIMD kernel is tested against, and what embedding lookups use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gguf/tensor_type.hpp"
#include "troupe/result.hpp"

namespace troupe::gguf {

// Bytes one row of `cols` elements of `type` takes.
std::size_t row_bytes(TensorType type, std::int64_t cols);

// Whether dequantize_row decodes this type.
bool can_dequantize(TensorType type);

// Q4_K's and Q5_K's 6-bit scale and minimum of sub-block j (0-7), from their 12 packed bytes
// (ggml's get_scale_min_k4).
void k_scale_min(int j, const std::uint8_t* q, std::uint8_t& scale, std::uint8_t& min);
// A Q6_K super-block's 256 quants as unsigned 6-bit values u (value i is
// d * scale[i / 16] * (u[i] - 32)).
void q6_k_quants(const std::uint8_t* block, std::uint8_t* u);
// Q3_K's sixteen 6-bit scales from their 12 packed bytes (a block's bytes 96-107), as the
// signed values the decoder multiplies (stored - 32).
void q3_k_scales(const std::uint8_t* packed, int* scales);

// Decodes `cols` elements at `data` into out[0..cols), as ggml's dequantize_row_* do. Types:
// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS
// and MXFP4.
Result<void> dequantize_row(TensorType type, const void* data, std::int64_t cols, float* out);

// Encodes floats as `type`: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL,
// IQ4_XS and MXFP4 as ggml's reference quantizers do (quantize_row_*_ref, the same bytes);
// Q4_K, Q5_K and Q6_K by a plain min/max mapping (valid blocks, for random models).
Result<std::vector<std::byte>> quantize(TensorType type, std::span<const float> values,
                                        std::int64_t cols);

}  // namespace troupe::gguf
