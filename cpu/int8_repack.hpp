// Quantized weights repacked for prefill: rows interleaved in groups of 16, so that one
// 512-bit register holds four values of each of 16 rows, and one vpdpbusd multiplies them by
// four activations broadcast to every lane. A block's 32 (or 16) byte products then sum in
// int32 for 16 rows at once, and the float work (convert, scale, accumulate) is done once per
// block for 16 rows, not once per four values of one row as in int8_matmul's layout. A tile is
// 16 weight rows by up to 8 activation rows: each weight register is loaded once and used by
// every activation row of the tile.
//
// The math per (activation row t, weight row r), the same for every tile and batch size, so a
// row's result never depends on what shares its call:
//   acc = 0; for each block b in order:
//     acc = fma(float(I_b), a_rb * s_tb, acc)      I_b: the exact integer dot of the block
//     acc = fma(c_rb, s_tb * sum q_tb, acc)         (types with minimums: Q4_1, Q5_1, Q4_K, Q5_K)
// where weights are a * (u - offset) (+ c for minimums) and the offset's share is folded into
// I_b in int32 (-offset * sum q). repacked_matmul_reference computes exactly this in scalar
// code; the vector kernel must equal it bit for bit (tested).
//
// Types: Q8_0 (u = q + 128, offset 128); Q4_0, Q5_0 (offsets 8, 16), Q4_1, Q5_1 (c = m),
// IQ4_NL (u = level + 128, offset 128); MXFP4 (a = its E8M0 scale halved, kept as float32;
// u = the doubled FP4 level + 12, offset 12); Q4_K, Q5_K (blocks of 32, a = d * scale,
// c = -dmin * min), IQ4_XS (a = d * (scale - 32), offset 128), Q6_K (blocks of 16,
// a = d * scale, offset 32). Each row keeps as many bits as in the file (4-bit stays 4-bit,
// Q6_K 6-bit; the K-quants' packed 6-bit scales take a byte each), only their order changes.
// Q2_K (blocks of 16, a = d * scale, c = -dmin * min) and Q3_K (blocks of 16, a = d *
// scale, offset 4): the 2-bit fields four to a byte, Q3_K's third bits eight to a byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/int8_matmul.hpp"
#include "gguf/tensor_type.hpp"

namespace troupe::cpu {

inline constexpr std::int64_t kRepackRows = 16;

// Whether `type` has a repacked layout for rows of `cols` values.
bool can_repack(gguf::TensorType type, std::int64_t cols);
// The instruction sets this processor runs the repacked kernel of `type` on, the fastest
// last: AVX-512 VNNI, AVX-VNNI, or AVX2 for the types whose unsigned bytes stay <= 63 (not
// Q8_0, IQ4_NL, IQ4_XS: pmaddubsw's pair sums would saturate). Empty: the type keeps
// int8_matmul's layout here, whose kernels exist for every path.
std::vector<Int8Path> repacked_paths(gguf::TensorType type);
bool repacked_kernel_available(gguf::TensorType type);

struct RepackedWeight {
  struct Free {
    void operator()(std::byte* p) const;
  };
  gguf::TensorType type = gguf::TensorType::f32;
  std::int64_t rows = 0, cols = 0;
  std::int64_t groups = 0;      // ceil(rows / 16); the last group's missing rows are zero
  std::size_t group_bytes = 0;  // bytes of one group of 16 rows
  std::unique_ptr<std::byte, Free> data;

  const std::byte* group(std::int64_t g) const { return data.get() + g * group_bytes; }
  std::size_t bytes() const { return static_cast<std::size_t>(groups) * group_bytes; }
};

// An empty RepackedWeight (groups 0) to fill group by group: the groups may be repacked from
// several threads at once.
RepackedWeight allocate_repacked(gguf::TensorType type, std::int64_t rows, std::int64_t cols);
// Repacks group `g` of `w` (rows of w_row_bytes, in the file's layout) into `into`.
void repack_group(RepackedWeight& into, const std::byte* w, std::size_t w_row_bytes,
                  std::int64_t g);

// out[t * out_stride + r] = dot(x[t], w[r]) for t < num_x and r in the groups [g_begin, g_end)
// (out points at row 0's column): by the vector kernel of the fastest path for w's type.
void repacked_matmul(const RepackedWeight& w, const Int8Rows& x, std::int64_t num_x,
                     std::int64_t g_begin, std::int64_t g_end, float* out, std::int64_t out_stride);
// The same on a given path of repacked_paths(w.type) (tests run every one).
void repacked_matmul_on(Int8Path path, const RepackedWeight& w, const Int8Rows& x,
                        std::int64_t num_x, std::int64_t g_begin, std::int64_t g_end, float* out,
                        std::int64_t out_stride);
// The same in scalar code, operation for operation (tests).
void repacked_matmul_reference(const RepackedWeight& w, const Int8Rows& x, std::int64_t num_x,
                               std::int64_t g_begin, std::int64_t g_end, float* out,
                               std::int64_t out_stride);

// The repacked kernel's instruction at its peak on this thread, multiply-adds per second
// (512-bit vpdpbusd on registers, no memory; 0 without AVX-512 VNNI): the bound a
// profile's int8 matmuls are measured against.
double int8_peak_macs_per_second(double seconds);

// Rows [r0, r0 + rows) of a weight's product with `x` (num_x rows) into out[t * out_stride + i]
// (out: row r0's column), through `packed` where the weight has been repacked (r0 then a
// multiple of 16, and r0 + rows one too or the weight's last row), else through int8_matmul
// on the file's layout (w: the file's rows).
void int8_product(gguf::TensorType type, const RepackedWeight* packed, const std::byte* w,
                  std::size_t w_row_bytes, const Int8Rows& x, std::int64_t num_x, std::int64_t r0,
                  std::int64_t rows, float* out, std::int64_t out_stride);

// For the kernels: where a group's fields lie, per block unit (Q8_0, Q4_0: a block of 32;
// Q4_K, Q6_K: a super-block of 256).
struct RepackLayout {
  std::int64_t unit_values;  // values per unit
  std::size_t unit_bytes;    // bytes per unit of 16 rows
  int sum_values = 32;       // values per int32 sum, each with its own scale (16 or 32)
};
constexpr RepackLayout repack_layout(gguf::TensorType type) {
  using gguf::TensorType;
  switch (type) {
    case TensorType::q8_0:
      return {32, 16 * 34};
    case TensorType::q4_0:
    case TensorType::iq4_nl:
      return {32, 16 * 18};
    case TensorType::q4_1:
      return {32, 16 * 20};
    case TensorType::mxfp4:  // d as float32: an E8M0 scale may be outside F16's range
      return {32, 16 * 4 + 256};
    case TensorType::q5_0:
      return {32, 16 * 22};
    case TensorType::q5_1:
      return {32, 16 * 24};
    case TensorType::q4_k:
      return {256, 16 * 144 + 64};
    case TensorType::q5_k:
      return {256, 16 * 176 + 64};
    case TensorType::iq4_xs:
      return {256, 16 * 136 + 32};
    case TensorType::q6_k:
      return {256, 16 * 210, 16};
    case TensorType::q2_k:
      return {256, 16 * 84, 16};
    case TensorType::q3_k:  // the 6-bit scales a byte each
      return {256, 16 * 114, 16};
    default:
      return {0, 0};
  }
}

// Q2_K's and Q3_K's units: where the 2-bit fields begin (16 sub-blocks of 64 bytes), and
// Q3_K's third bits after them (8 vectors of 64 bytes, two sub-blocks each).
constexpr std::size_t low2_at(gguf::TensorType type) {
  return type == gguf::TensorType::q2_k ? 320 : 288;
}
inline constexpr std::size_t kQ3HighBitsAt = 288 + 16 * 64;

// What the kernel subtracts from each u (folded into the integer sums); 0 where the type has
// minimums instead (Q4_1, Q5_1, Q4_K, Q5_K, Q2_K).
constexpr int repack_offset(gguf::TensorType type) {
  using gguf::TensorType;
  switch (type) {
    case TensorType::q8_0:
    case TensorType::iq4_nl:
    case TensorType::iq4_xs:
      return 128;
    case TensorType::q4_0:
      return 8;
    case TensorType::mxfp4:
      return 12;
    case TensorType::q5_0:
      return 16;
    case TensorType::q6_k:
      return 32;
    case TensorType::q3_k:
      return 4;
    default:
      return 0;
  }
}

// The blocks of 32 with 4-bit quants (and a fifth bit, a minimum or a table): one layout.
constexpr bool is_repacked_nibbles32(gguf::TensorType type) {
  using gguf::TensorType;
  return type == TensorType::q4_0 || type == TensorType::q4_1 || type == TensorType::q5_0 ||
         type == TensorType::q5_1 || type == TensorType::iq4_nl || type == TensorType::mxfp4;
}

}  // namespace troupe::cpu
