// Small per-row pieces the CPU backend's ops share (cpu_backend.cpp, cpu_backend_moe.cpp), so
// that a dense FFN and an expert compute the very same numbers.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/kernels.hpp"

namespace troupe::cpu {

// Output rows per task of a matmul over `rows`: about 8 tasks a thread, in whole groups of 16
// (the repacked kernel's, int8_repack.hpp; a multiple of the other kernels' tiles of 4).
inline std::int64_t rows_per_task(std::int64_t rows, int num_threads) {
  const std::int64_t target = std::max<std::int64_t>(1, rows / (8 * num_threads));
  return (target + 15) / 16 * 16;
}

// out = silu(gate) * up over n values (out may be gate), vectorised (kernels.hpp).
inline void swiglu_row(const float* gate, const float* up, float* out, std::int64_t n) {
  swiglu_row_simd(gate, up, out, n);
}

// x += bias over n values.
inline void add_bias_row(float* x, const float* bias, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) x[i] += bias[i];
}

}  // namespace troupe::cpu
