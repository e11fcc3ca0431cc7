// Float weights (F32, F16, BF16) repacked into panels for the float kernel: rows in groups
// of 16, and within a group, for each column k, the 16 rows' values side by side (32 bytes
// for F16 and BF16, 64 for F32). Each row keeps its type and bits; only their order changes.
//
// The kernel is the outer-product form of a GEMM micro-kernel: a register holds column k of
// 16 weight rows (converted to float once), an activation's value x[t][k] is broadcast to
// every lane, and one FMA adds the 16 products to 16 accumulators that are the 16 outputs
// themselves; a tile is up to 8 activation rows by 3 panels (48 weight rows) on AVX-512.
// Each loaded weight register serves every activation row of the tile, and no output needs
// a horizontal sum. The file-layout kernel (kernels.hpp) it replaces loads a weight vector
// per 4 activation rows and sums each dot product across lanes.
//
// The math per (activation row t, weight row r), the same for every tile, batch size and
// thread split, so a row's result never depends on what shares its call:
//   acc = 0; for k = 0 .. cols - 1 in order: acc = fma(x[t][k], w[r][k], acc)
// (a multiply and an add where the SIMD target has no FMA). float_panels_reference computes
// exactly this in scalar code; on a target with FMA the kernel equals it bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/int8_repack.hpp"
#include "gguf/tensor_type.hpp"

namespace troupe::cpu {

// Whether `type` is a float type with a panel layout (F32, F16, BF16).
bool has_float_panels(gguf::TensorType type);

// An empty RepackedWeight of float panels (groups of 16 rows; the last group's missing rows
// are zero) to fill group by group, from several threads at once if need be.
RepackedWeight allocate_float_panels(gguf::TensorType type, std::int64_t rows, std::int64_t cols);
// Repacks group `g` of `w` (rows of w_row_bytes, in the file's layout) into `into`.
void repack_float_group(RepackedWeight& into, const std::byte* w, std::size_t w_row_bytes,
                        std::int64_t g);

// out[t * out_stride + r] = dot(x[t], w[r]) for t < num_x and the rows r of the groups
// [g_begin, g_end) (out points at row 0's column; rows past w.rows are not written).
void float_panels_matmul(const RepackedWeight& w, const float* x, std::int64_t x_stride,
                         std::int64_t num_x, std::int64_t g_begin, std::int64_t g_end, float* out,
                         std::int64_t out_stride);
// The same in scalar code with std::fma, operation for operation (tests).
void float_panels_reference(const RepackedWeight& w, const float* x, std::int64_t x_stride,
                            std::int64_t num_x, std::int64_t g_begin, std::int64_t g_end,
                            float* out, std::int64_t out_stride);
// Whether the dispatched SIMD target fuses the multiply and add (then the kernel equals
// float_panels_reference bit for bit).
bool float_panels_fused();

}  // namespace troupe::cpu
