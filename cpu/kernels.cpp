// Highway kernels, compiled once per SIMD target by foreach_target.h.
#include "cpu/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gguf/half.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace troupe::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using gguf::TensorType;

// ---- float weights -------------------------------------------------------

using DF = hn::CappedTag<float, 16>;

template <TensorType kType>
HWY_INLINE hn::Vec<DF> load_weights(DF d, const std::byte* w, std::int64_t k) {
  if constexpr (kType == TensorType::f32) {
    return hn::LoadU(d, reinterpret_cast<const float*>(w) + k);
  } else if constexpr (kType == TensorType::f16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(w) + k));
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(w) + k));
  }
}

template <TensorType kType>
HWY_INLINE float weight_scalar(const std::byte* w, std::int64_t k) {
  if constexpr (kType == TensorType::f32) {
    return reinterpret_cast<const float*>(w)[k];
  } else {
    std::uint16_t bits;
    std::memcpy(&bits, w + 2 * k, 2);
    return kType == TensorType::f16 ? gguf::f16_to_f32(bits) : gguf::bf16_to_f32(bits);
  }
}

// NT activation rows x NR weight rows; one accumulator chain per dot product.
template <TensorType kType, int NT, int NR>
HWY_INLINE void tile_float(const float* x, std::int64_t x_stride, const std::byte* w,
                           std::size_t w_row_bytes, std::int64_t cols, float* out,
                           std::int64_t out_stride) {
  const DF d;
  const std::int64_t lanes = static_cast<std::int64_t>(hn::Lanes(d));
  hn::Vec<DF> acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = hn::Zero(d);
  std::int64_t k = 0;
  for (; k + lanes <= cols; k += lanes) {
    hn::Vec<DF> wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = load_weights<kType>(d, w + r * w_row_bytes, k);
    for (int t = 0; t < NT; ++t) {
      const auto xv = hn::LoadU(d, x + t * x_stride + k);
      for (int r = 0; r < NR; ++r) acc[t][r] = hn::MulAdd(xv, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < NR; ++r) {
      float sum = hn::GetLane(hn::SumOfLanes(d, acc[t][r]));
      for (std::int64_t kk = k; kk < cols; ++kk) {
        sum += x[t * x_stride + kk] * weight_scalar<kType>(w + r * w_row_bytes, kk);
      }
      out[t * out_stride + r] = sum;
    }
  }
}

template <TensorType kType>
void matmul_float(const float* x, std::int64_t x_stride, std::int64_t num_x, const std::byte* w,
                  std::size_t w_row_bytes, std::int64_t num_w, std::int64_t cols, float* out,
                  std::int64_t out_stride) {
  constexpr int NT = 4, NR = 4;
  std::int64_t t = 0;
  for (; t + NT <= num_x; t += NT) {
    std::int64_t r = 0;
    for (; r + NR <= num_w; r += NR) {
      tile_float<kType, NT, NR>(x + t * x_stride, x_stride, w + r * w_row_bytes, w_row_bytes, cols,
                                out + t * out_stride + r, out_stride);
    }
    for (; r < num_w; ++r) {
      tile_float<kType, NT, 1>(x + t * x_stride, x_stride, w + r * w_row_bytes, w_row_bytes, cols,
                               out + t * out_stride + r, out_stride);
    }
  }
  for (; t < num_x; ++t) {
    std::int64_t r = 0;
    for (; r + NR <= num_w; r += NR) {
      tile_float<kType, 1, NR>(x + t * x_stride, x_stride, w + r * w_row_bytes, w_row_bytes, cols,
                               out + t * out_stride + r, out_stride);
    }
    for (; r < num_w; ++r) {
      tile_float<kType, 1, 1>(x + t * x_stride, x_stride, w + r * w_row_bytes, w_row_bytes, cols,
                              out + t * out_stride + r, out_stride);
    }
  }
}

void MatmulTileFloat(TensorType type, const float* x, std::int64_t x_stride, std::int64_t num_x,
                     const std::byte* w, std::size_t w_row_bytes, std::int64_t num_w,
                     std::int64_t cols, float* out, std::int64_t out_stride) {
  switch (type) {
    case TensorType::f32:
      return matmul_float<TensorType::f32>(x, x_stride, num_x, w, w_row_bytes, num_w, cols, out,
                                           out_stride);
    case TensorType::f16:
      return matmul_float<TensorType::f16>(x, x_stride, num_x, w, w_row_bytes, num_w, cols, out,
                                           out_stride);
    default:
      return matmul_float<TensorType::bf16>(x, x_stride, num_x, w, w_row_bytes, num_w, cols, out,
                                            out_stride);
  }
}

// ---- quantized weights ---------------------------------------------------
// Per block of 32: an exact int32 dot of int8 weights and int8 activations
// (widened to int16, multiplied pairwise), then scaled into a float accumulator.

using D16 = hn::CappedTag<std::int16_t, 16>;
using D32 = hn::RepartitionToWide<D16>;
using DQF = hn::Rebind<float, D32>;
using DU16 = hn::RebindToUnsigned<D16>;

template <TensorType kType>
HWY_INLINE float block_scale(const std::byte* block) {
  std::uint16_t bits;
  std::memcpy(&bits, block, 2);
  return gguf::f16_to_f32(bits);
}

// Integer dot of one weight block with one activation block.
template <TensorType kType>
HWY_INLINE hn::Vec<D32> block_dot(const std::byte* block, const std::int8_t* xq) {
  const D16 d16;
  const D32 d32;
  const std::int64_t n16 = static_cast<std::int64_t>(hn::Lanes(d16));
  auto sum0 = hn::Zero(d32);
  auto sum1 = hn::Zero(d32);
  if constexpr (kType == TensorType::q8_0) {
    const hn::Rebind<std::int8_t, D16> d8;
    const auto* qs = reinterpret_cast<const std::int8_t*>(block + 2);
    for (std::int64_t j = 0; j < kQ8Block; j += n16) {
      const auto wv = hn::PromoteTo(d16, hn::LoadU(d8, qs + j));
      const auto xv = hn::PromoteTo(d16, hn::LoadU(d8, xq + j));
      sum0 = hn::ReorderWidenMulAccumulate(d32, wv, xv, sum0, sum1);
    }
  } else {  // q4_0: low nibbles are elements 0..15, high nibbles 16..31
    const hn::Rebind<std::uint8_t, D16> du8;
    const DU16 du16;
    const hn::Rebind<std::int8_t, D16> d8;
    const auto* qs = reinterpret_cast<const std::uint8_t*>(block + 2);
    const auto mask = hn::Set(du16, 0x0f);
    const auto eight = hn::Set(d16, 8);
    for (std::int64_t j = 0; j < 16; j += n16) {
      const auto packed = hn::PromoteTo(du16, hn::LoadU(du8, qs + j));
      const auto lo = hn::Sub(hn::BitCast(d16, hn::And(packed, mask)), eight);
      const auto hi = hn::Sub(hn::BitCast(d16, hn::ShiftRight<4>(packed)), eight);
      sum0 = hn::ReorderWidenMulAccumulate(d32, lo, hn::PromoteTo(d16, hn::LoadU(d8, xq + j)), sum0,
                                           sum1);
      sum0 = hn::ReorderWidenMulAccumulate(d32, hi, hn::PromoteTo(d16, hn::LoadU(d8, xq + 16 + j)),
                                           sum0, sum1);
    }
  }
  return hn::RearrangeToOddPlusEven(sum0, sum1);
}

template <TensorType kType, int NT, int NR>
HWY_INLINE void tile_quantized(const std::int8_t* xq, const float* xd, std::int64_t cols,
                               const std::byte* w, std::size_t w_row_bytes, float* out,
                               std::int64_t out_stride) {
  constexpr std::size_t kBlockBytes = kType == TensorType::q8_0 ? 34 : 18;
  const DQF df;
  const std::int64_t num_blocks = cols / kQ8Block;
  hn::Vec<DQF> acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = hn::Zero(df);
  for (std::int64_t b = 0; b < num_blocks; ++b) {
    for (int r = 0; r < NR; ++r) {
      const std::byte* block = w + r * w_row_bytes + b * kBlockBytes;
      const float dw = block_scale<kType>(block);
      for (int t = 0; t < NT; ++t) {
        const auto sum = block_dot<kType>(block, xq + t * cols + b * kQ8Block);
        const float scale = dw * xd[t * num_blocks + b];
        acc[t][r] = hn::MulAdd(hn::ConvertTo(df, sum), hn::Set(df, scale), acc[t][r]);
      }
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r)
      out[t * out_stride + r] = hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
}

template <TensorType kType>
void matmul_quantized(const std::int8_t* xq, const float* xd, std::int64_t num_x,
                      const std::byte* w, std::size_t w_row_bytes, std::int64_t num_w,
                      std::int64_t cols, float* out, std::int64_t out_stride) {
  constexpr int NT = 4, NR = 2;
  const std::int64_t num_blocks = cols / kQ8Block;
  std::int64_t t = 0;
  for (; t + NT <= num_x; t += NT) {
    std::int64_t r = 0;
    for (; r + NR <= num_w; r += NR) {
      tile_quantized<kType, NT, NR>(xq + t * cols, xd + t * num_blocks, cols, w + r * w_row_bytes,
                                    w_row_bytes, out + t * out_stride + r, out_stride);
    }
    for (; r < num_w; ++r) {
      tile_quantized<kType, NT, 1>(xq + t * cols, xd + t * num_blocks, cols, w + r * w_row_bytes,
                                   w_row_bytes, out + t * out_stride + r, out_stride);
    }
  }
  for (; t < num_x; ++t) {
    std::int64_t r = 0;
    for (; r + 4 <= num_w; r += 4) {
      tile_quantized<kType, 1, 4>(xq + t * cols, xd + t * num_blocks, cols, w + r * w_row_bytes,
                                  w_row_bytes, out + t * out_stride + r, out_stride);
    }
    for (; r < num_w; ++r) {
      tile_quantized<kType, 1, 1>(xq + t * cols, xd + t * num_blocks, cols, w + r * w_row_bytes,
                                  w_row_bytes, out + t * out_stride + r, out_stride);
    }
  }
}

void MatmulTileQuantized(TensorType type, const std::int8_t* xq, const float* xd,
                         std::int64_t num_x, const std::byte* w, std::size_t w_row_bytes,
                         std::int64_t num_w, std::int64_t cols, float* out,
                         std::int64_t out_stride) {
  if (type == TensorType::q8_0) {
    matmul_quantized<TensorType::q8_0>(xq, xd, num_x, w, w_row_bytes, num_w, cols, out, out_stride);
  } else {
    matmul_quantized<TensorType::q4_0>(xq, xd, num_x, w, w_row_bytes, num_w, cols, out, out_stride);
  }
}

const char* TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace troupe::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace troupe::cpu {

HWY_EXPORT(MatmulTileFloat);
HWY_EXPORT(MatmulTileQuantized);
HWY_EXPORT(TargetName);

void matmul_tile_float(gguf::TensorType type, const float* x, std::int64_t x_stride,
                       std::int64_t num_x, const std::byte* w, std::size_t w_row_bytes,
                       std::int64_t num_w, std::int64_t cols, float* out, std::int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(MatmulTileFloat)
  (type, x, x_stride, num_x, w, w_row_bytes, num_w, cols, out, out_stride);
}

void matmul_tile_quantized(gguf::TensorType type, const std::int8_t* xq, const float* xd,
                           std::int64_t num_x, const std::byte* w, std::size_t w_row_bytes,
                           std::int64_t num_w, std::int64_t cols, float* out,
                           std::int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(MatmulTileQuantized)
  (type, xq, xd, num_x, w, w_row_bytes, num_w, cols, out, out_stride);
}

void quantize_row_q8(const float* x, std::int64_t n, std::int8_t* q, float* d) {
  for (std::int64_t b = 0; b < n / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    float amax = 0.0f;
    for (std::int64_t i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float scale = amax / 127.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    d[b] = scale;
    for (std::int64_t i = 0; i < kQ8Block; ++i) {
      q[b * kQ8Block + i] = static_cast<std::int8_t>(std::nearbyint(xb[i] * inverse));
    }
  }
}

const char* simd_target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}

}  // namespace troupe::cpu
#endif
