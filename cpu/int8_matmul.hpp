// Matrix products of quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against int8 activations, the weights never decoded to float: per
// 32 values, an exact integer dot product (VNNI's vpdpbusd, or AVX2's pmaddubsw + pmaddwd, or plain
// C++), scaled once into a float accumulator. The path is chosen once from what the processor has;
// each path computes a row's result by one fixed sequence of operations whatever the tile it sits
// in, so a row's result never depends on how many other rows share the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "gguf/tensor_type.hpp"

namespace troupe::cpu {

// One matmul's activations, quantized once per row: every 32 values share one scale (as
// Q8_0). The kernels read the scales spread over lanes of 4 values, and the scaled sums of
// every 16 values, which the weights' offsets and minimums multiply.
struct Int8Rows {
  const std::int8_t* q = nullptr;          // [rows, cols]
  const float* lane_scales = nullptr;      // [rows, cols / 4]: the scale of values 4l..4l+3
  const float* sums = nullptr;             // [rows, cols / 16]: scale * sum of q[16g..16g+16)
  std::int64_t cols = 0;                   // a multiple of 32
  const std::int32_t* int_sums = nullptr;  // [rows, cols / 16]: sum of q[16g..16g+16), exact

  // The rows from `first` on.
  Int8Rows from_row(std::int64_t first) const {
    return {q + first * cols, lane_scales + first * (cols / 4), sums + first * (cols / 16), cols,
            int_sums + first * (cols / 16)};
  }
};

// Storage for Int8Rows, reused across calls.
class Int8RowBuffer {
 public:
  void resize(std::int64_t rows, std::int64_t cols);
  // Quantizes row `r` (cols floats) in place; rows may be filled from several threads.
  void quantize_row(std::int64_t r, const float* x);
  Int8Rows rows() const {
    return {q_.data(), lane_scales_.data(), sums_.data(), cols_, int_sums_.data()};
  }

 private:
  std::int64_t cols_ = 0;
  std::vector<std::int8_t> q_;
  std::vector<float> lane_scales_;
  std::vector<float> sums_;
  std::vector<std::int32_t> int_sums_;
};

// The instruction sets the int8 kernels are written for, from the most portable.
enum class Int8Path { portable, avx2, avx_vnni, avx512_vnni };

std::string_view int8_path_name(Int8Path path);
// Every path this processor can run (portable first), and the fastest of them.
std::span<const Int8Path> supported_int8_paths();
Int8Path best_int8_path();
bool int8_path_supported(Int8Path path);

// Whether `type` has an int8 kernel for rows of `cols` values.
bool has_int8_kernel(gguf::TensorType type, std::int64_t cols);

// out[t * out_stride + r] = dot(x[t], w[r]) for t < num_x, r < num_w, on the best path.
//   w: [num_w] rows of w_row_bytes, each x.cols values of `type`
void int8_matmul(gguf::TensorType type, const Int8Rows& x, std::int64_t num_x, const std::byte* w,
                 std::size_t w_row_bytes, std::int64_t num_w, float* out, std::int64_t out_stride);
// The same on a given path (tests run every path the processor has).
void int8_matmul_on(Int8Path path, gguf::TensorType type, const Int8Rows& x, std::int64_t num_x,
                    const std::byte* w, std::size_t w_row_bytes, std::int64_t num_w, float* out,
                    std::int64_t out_stride);

// For the kernels: where the fields of ggml's blocks of 32 values lie. Each starts with its
// scale d (an f16, or MXFP4's E8M0 byte); value i is d * (u_i - offset) + m, u_i the quant
// byte (Q8_0: signed) or the nibble of byte i % 16 (low for i < 16), with bit i of the
// fifth-bit word added as 16; or, for a table type, d * table[nibble].
struct Block32Layout {
  std::size_t bytes;      // per block
  std::size_t min;        // where the f16 m lies (Q4_1, Q5_1); 0: no m
  std::size_t high_bits;  // where the little-endian uint32 of fifth bits lies (Q5_0, Q5_1); 0: none
  std::size_t quants;     // where the 32 quant bytes (Q8_0) or 16 nibble pairs lie
  int offset;             // 8 (Q4_0), 16 (Q5_0), else 0
  const std::int8_t* table = nullptr;  // the nibbles' levels (IQ4_NL, MXFP4)
  bool e8m0 = false;                   // d is one E8M0 byte, 2^(e - 128) (MXFP4)
};

constexpr bool is_block32(gguf::TensorType type) {
  using gguf::TensorType;
  return type == TensorType::q8_0 || type == TensorType::q4_0 || type == TensorType::q4_1 ||
         type == TensorType::q5_0 || type == TensorType::q5_1 || type == TensorType::iq4_nl ||
         type == TensorType::mxfp4;
}

constexpr Block32Layout block32_layout(gguf::TensorType type) {
  using gguf::TensorType;
  switch (type) {
    case TensorType::q8_0:
      return {34, 0, 0, 2, 0};
    case TensorType::q4_0:
      return {18, 0, 0, 2, 8};
    case TensorType::q4_1:
      return {20, 2, 0, 4, 0};
    case TensorType::q5_0:
      return {22, 0, 2, 6, 16};
    case TensorType::q5_1:
      return {24, 2, 4, 8, 0};
    case TensorType::iq4_nl:
      return {18, 0, 0, 2, 0, gguf::kIq4NlValues};
    case TensorType::mxfp4:
      return {17, 0, 0, 1, 0, gguf::kMxfp4Values, true};
    default:  // not a block of 32 (is_block32)
      return {0, 0, 0, 0, 0};
  }
}

// For the kernels: a row's blocks of 32 (is_block32 types) past its last whole chunk of 256
// values, in plain integer arithmetic. Compiled once, without the vector files' flags: built
// with -mavxvnni, GCC 12 auto-vectorized this signed-by-signed byte loop into wrong sums here
// (caught by the int8 kernel test).
float int8_tail_dot(gguf::TensorType type, const std::byte* w_row, const std::int8_t* q,
                    const float* lane_scales, std::int64_t cols);

}  // namespace troupe::cpu
