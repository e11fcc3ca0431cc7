// Highway kernels, compiled once per SIMD target by foreach_target.h.
#include "cpu/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/prefetch.hpp"
#include "gguf/half.hpp"
#include "troupe/result.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
//
#include <hwy/contrib/math/math-inl.h>

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
  constexpr std::int64_t kBytes = kType == TensorType::f32 ? 4 : 2;
  std::int64_t k = 0;
  for (; k + lanes <= cols; k += lanes) {
    hn::Vec<DF> wv[NR];
    for (int r = 0; r < NR; ++r) {
      // The row's bytes 4 KB ahead: a decode row streams several weight rows at once, more
      // than the hardware prefetcher keeps in flight (as the int8 kernels do).
      __builtin_prefetch(w + r * w_row_bytes + k * kBytes + kPrefetchBytes);
      wv[r] = load_weights<kType>(d, w + r * w_row_bytes, k);
    }
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

// Int8RowBuffer::quantize_row's blocks of 32 (int8_matmul.hpp), vectorised: amax, the scale
// amax / 127, each value times 1 / scale rounded to nearest even, the sums of 16.
void QuantizeRowInt8(const float* x, std::int64_t cols, std::int8_t* q, float* lane_scales,
                     float* sums, std::int32_t* int_sums) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::int8_t, DF> d8;
  const auto n = static_cast<std::int64_t>(hn::Lanes(d));
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + b * 32;
    auto amax = hn::Zero(d);
    auto finite = hn::IsFinite(hn::LoadU(d, xb));
    for (std::int64_t i = 0; i < 32; i += n) {
      const auto v = hn::LoadU(d, xb + i);
      amax = hn::Max(amax, hn::Abs(v));
      finite = hn::And(finite, hn::IsFinite(v));
    }
    if (!hn::AllTrue(d, finite)) {
      // An activation that is NaN or infinite makes its products NaN, as the float path's
      // would, instead of a finite number that hides where it came from.
      std::fill_n(q + b * 32, 32, std::int8_t{0});
      std::fill_n(lane_scales + b * 8, 8, std::numeric_limits<float>::quiet_NaN());
      sums[2 * b] = sums[2 * b + 1] = std::numeric_limits<float>::quiet_NaN();
      int_sums[2 * b] = int_sums[2 * b + 1] = 0;
      continue;
    }
    const float scale = hn::GetLane(hn::MaxOfLanes(d, amax)) / 127.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    const auto inv = hn::Set(d, inverse);
    for (int g = 0; g < 2; ++g) {
      auto sum = hn::Zero(di);
      for (std::int64_t i = 16 * g; i < 16 * g + 16; i += n) {
        const auto r = hn::ConvertTo(di, hn::Round(hn::Mul(hn::LoadU(d, xb + i), inv)));
        sum = hn::Add(sum, r);
        hn::StoreU(hn::DemoteTo(d8, r), d8, q + b * 32 + i);
      }
      const std::int32_t total = hn::GetLane(hn::SumOfLanes(di, sum));
      int_sums[2 * b + g] = total;
      sums[2 * b + g] = scale * static_cast<float>(total);
    }
    std::fill_n(lane_scales + b * 8, 8, scale);
  }
}

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up, vectorised (Highway's exp).
void SwigluRow(const float* gate, const float* up, float* out, std::int64_t n) {
  const DF d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  std::int64_t i = 0;
  const auto at = [&](std::int64_t k) {
    const auto g = hn::LoadU(d, gate + k);
    const auto silu = hn::Div(g, hn::Add(one, hn::CallExp(d, hn::Neg(g))));
    return hn::Mul(silu, hn::LoadU(d, up + k));
  };
  for (; i + lanes <= n; i += lanes) hn::StoreU(at(i), d, out + i);
  if (i < n) {  // the tail, through a padded copy (the same operations)
    alignas(64) float g[16] = {}, u[16] = {}, o[16];
    std::copy(gate + i, gate + n, g);
    std::copy(up + i, up + n, u);
    const auto gv = hn::LoadU(d, g);
    hn::StoreU(hn::Mul(hn::Div(gv, hn::Add(one, hn::CallExp(d, hn::Neg(gv)))), hn::LoadU(d, u)), d,
               o);
    std::copy(o, o + (n - i), out + i);
  }
}

// out = f32_to_f16_saturated(in) over n values (gguf/half.hpp): beyond F16's range the
// largest finite half of its sign, NaN stays NaN, the rest rounded to nearest even.
// Highway 1.0.3 emulates the demotion where x86 has no F16C (SSE4 and below), flushing
// subnormals and losing NaN: there the scalar conversion does it.
void F32ToF16Saturated(const float* in, std::uint16_t* out, std::int64_t n) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const DF d;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto lo = hn::Set(d, -65504.0f), hi = hn::Set(d, 65504.0f);
  auto* o = reinterpret_cast<hwy::float16_t*>(out);
  const auto convert = [&](hn::Vec<DF> v) {
    return hn::DemoteTo(dh, hn::IfThenElse(hn::IsNaN(v), v, hn::Min(hn::Max(v, lo), hi)));
  };
  std::int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(convert(hn::LoadU(d, in + i)), dh, o + i);
#else
  std::int64_t i = 0;
#endif
  for (; i < n; ++i) out[i] = gguf::f32_to_f16_saturated(in[i]);
}

// LoRA's expansion (cpu/kernels.hpp lora_expand): y_t[j] += scale * sum_k ax[t][k] *
// b_t[k][j] over B transposed ([rank][n_out]), so that columns are vector lanes and no
// horizontal sum is needed; NT rows and 4 vectors of columns in registers, each element one
// chain of multiply-adds over k in order. Tails past the last full block take the scalar
// path, with the same fused multiply-adds where the target has them.
HWY_INLINE float fused_multiply_add(float a, float b, float c) {
#if HWY_NATIVE_FMA
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

template <TensorType kType, int NT>
HWY_INLINE void lora_expand_rows(const float* ax, std::int64_t rank, const std::byte* b_t,
                                 std::int64_t n_out, std::int64_t j_begin, std::int64_t j_end,
                                 float scale, float* const* y) {
  const DF d;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, scale);
  constexpr int NJ = 4;
  constexpr std::int64_t kBytes = kType == TensorType::f32 ? 4 : 2;
  std::int64_t j = j_begin;
  for (; j + NJ * lanes <= j_end; j += NJ * lanes) {
    hn::Vec<DF> acc[NT][NJ];
    for (int t = 0; t < NT; ++t)
      for (int v = 0; v < NJ; ++v) acc[t][v] = hn::Zero(d);
    for (std::int64_t k = 0; k < rank; ++k) {
      hn::Vec<DF> b[NJ];
      const std::byte* row = b_t + k * n_out * kBytes;
      for (int v = 0; v < NJ; ++v) b[v] = load_weights<kType>(d, row, j + v * lanes);
      for (int t = 0; t < NT; ++t) {
        const auto a = hn::Set(d, ax[t * rank + k]);
        for (int v = 0; v < NJ; ++v) acc[t][v] = hn::MulAdd(a, b[v], acc[t][v]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      for (int v = 0; v < NJ; ++v) {
        float* out = y[t] + j + v * lanes;
        hn::StoreU(hn::MulAdd(s, acc[t][v], hn::LoadU(d, out)), d, out);
      }
    }
  }
  for (; j < j_end; ++j) {
    for (int t = 0; t < NT; ++t) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < rank; ++k) {
        acc = fused_multiply_add(ax[t * rank + k],
                                 weight_scalar<kType>(b_t + k * n_out * kBytes, j), acc);
      }
      y[t][j] = fused_multiply_add(scale, acc, y[t][j]);
    }
  }
}

template <TensorType kType>
void lora_expand_typed(const float* ax, std::int64_t num_rows, std::int64_t rank,
                       const std::byte* b_t, std::int64_t n_out, std::int64_t j_begin,
                       std::int64_t j_end, float scale, float* const* y) {
  std::int64_t t = 0;
  for (; t + 4 <= num_rows; t += 4) {
    lora_expand_rows<kType, 4>(ax + t * rank, rank, b_t, n_out, j_begin, j_end, scale, y + t);
  }
  switch (num_rows - t) {
    case 3:
      return lora_expand_rows<kType, 3>(ax + t * rank, rank, b_t, n_out, j_begin, j_end, scale,
                                        y + t);
    case 2:
      return lora_expand_rows<kType, 2>(ax + t * rank, rank, b_t, n_out, j_begin, j_end, scale,
                                        y + t);
    case 1:
      return lora_expand_rows<kType, 1>(ax + t * rank, rank, b_t, n_out, j_begin, j_end, scale,
                                        y + t);
    default:
      return;
  }
}

void LoraExpand(TensorType type, const float* ax, std::int64_t num_rows, std::int64_t rank,
                const std::byte* b_t, std::int64_t n_out, std::int64_t j_begin, std::int64_t j_end,
                float scale, float* const* y) {
  if (type == TensorType::f16) {
    return lora_expand_typed<TensorType::f16>(ax, num_rows, rank, b_t, n_out, j_begin, j_end, scale,
                                              y);
  }
  return lora_expand_typed<TensorType::f32>(ax, num_rows, rank, b_t, n_out, j_begin, j_end, scale,
                                            y);
}

const char* TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace troupe::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace troupe::cpu {

HWY_EXPORT(MatmulTileFloat);
HWY_EXPORT(TargetName);
HWY_EXPORT(QuantizeRowInt8);
HWY_EXPORT(SwigluRow);
HWY_EXPORT(F32ToF16Saturated);
HWY_EXPORT(LoraExpand);

void lora_expand(gguf::TensorType type, const float* ax, std::int64_t num_rows, std::int64_t rank,
                 const std::byte* b_t, std::int64_t n_out, std::int64_t j_begin, std::int64_t j_end,
                 float scale, float* const* y) {
  TROUPE_ASSERT(type == gguf::TensorType::f32 || type == gguf::TensorType::f16,
                "lora_expand takes F32 or F16");
  HWY_DYNAMIC_DISPATCH(LoraExpand)(type, ax, num_rows, rank, b_t, n_out, j_begin, j_end, scale, y);
}

void f32_to_f16_saturated_row(const float* in, std::uint16_t* out, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToF16Saturated)(in, out, n);
}

void swiglu_row_simd(const float* gate, const float* up, float* out, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(SwigluRow)(gate, up, out, n);
}

void quantize_row_int8(const float* x, std::int64_t cols, std::int8_t* q, float* lane_scales,
                       float* sums, std::int32_t* int_sums) {
  HWY_DYNAMIC_DISPATCH(QuantizeRowInt8)(x, cols, q, lane_scales, sums, int_sums);
}

void matmul_tile_float(gguf::TensorType type, const float* x, std::int64_t x_stride,
                       std::int64_t num_x, const std::byte* w, std::size_t w_row_bytes,
                       std::int64_t num_w, std::int64_t cols, float* out, std::int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(MatmulTileFloat)
  (type, x, x_stride, num_x, w, w_row_bytes, num_w, cols, out, out_stride);
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
