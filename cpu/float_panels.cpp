// The float panel kernel (float_panels.hpp), compiled once per SIMD target by foreach_target.h,
// and the panels' layout, repacking and scalar reference.
#include "cpu/float_panels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "gguf/half.hpp"
#include "troupe/result.hpp"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/float_panels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace troupe::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using gguf::TensorType;
using DF = hn::CappedTag<float, 16>;

// Lanes per vector, vectors per panel column of 16 rows, and the tile: NT activation rows by
// NP panels, as many accumulators as the target's registers hold beside the weights (32
// registers of 16 lanes on AVX-512: 24 accumulators; 16 on AVX2 and SSE4: 12).
constexpr int kLanes = static_cast<int>(hn::MaxLanes(DF()));
constexpr int kVectors = static_cast<int>(kRepackRows) / kLanes;
constexpr int kPanels = kVectors == 1 ? 3 : 1;
constexpr int kTileRows = std::max(1, (kLanes >= 16 ? 24 : 12) / (kPanels * kVectors));
// Decode (one activation row) streams more panels at once: more loads in flight.
constexpr int kDecodePanels = kVectors == 1 ? 4 : 1;

template <TensorType kType>
HWY_INLINE hn::Vec<DF> load_column(DF d, const std::byte* p, int v) {
  if constexpr (kType == TensorType::f32) {
    return hn::LoadU(d, reinterpret_cast<const float*>(p) + v * kLanes);
  } else if constexpr (kType == TensorType::f16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p) + v * kLanes));
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> dh;
    return hn::PromoteTo(d,
                         hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(p) + v * kLanes));
  }
}

// NT activation rows by NP panels starting at group `g` of w; rows past w.rows are dropped.
template <TensorType kType, int NT, int NP>
HWY_INLINE void panel_tile(const RepackedWeight& w, std::int64_t g, const float* x,
                           std::int64_t x_stride, float* out, std::int64_t out_stride) {
  const DF d;
  constexpr std::size_t kColumnBytes = (kType == TensorType::f32 ? 4 : 2) * kRepackRows;
  hn::Vec<DF> acc[NT][NP][kVectors];
  for (int t = 0; t < NT; ++t)
    for (int p = 0; p < NP; ++p)
      for (int v = 0; v < kVectors; ++v) acc[t][p][v] = hn::Zero(d);
  const std::byte* panel[NP];
  for (int p = 0; p < NP; ++p) panel[p] = w.group(g + p);
  for (std::int64_t k = 0; k < w.cols; ++k) {
    hn::Vec<DF> column[NP][kVectors];
    for (int p = 0; p < NP; ++p) {
      const std::byte* at = panel[p] + k * kColumnBytes;
      // A line ahead per 64 bytes: a decode streams several panels at once, more than the
      // hardware prefetcher keeps in flight.
      if ((k * kColumnBytes) % 64 == 0) __builtin_prefetch(at + 2048);
      for (int v = 0; v < kVectors; ++v) column[p][v] = load_column<kType>(d, at, v);
    }
    for (int t = 0; t < NT; ++t) {
      const auto xv = hn::Set(d, x[t * x_stride + k]);
      for (int p = 0; p < NP; ++p)
        for (int v = 0; v < kVectors; ++v)
          acc[t][p][v] = hn::MulAdd(xv, column[p][v], acc[t][p][v]);
    }
  }
  alignas(64) float result[kRepackRows];
  for (int p = 0; p < NP; ++p) {
    const std::int64_t row0 = (g + p) * kRepackRows;
    const std::int64_t valid = std::min<std::int64_t>(kRepackRows, w.rows - row0);
    for (int t = 0; t < NT; ++t) {
      float* o = out + t * out_stride + row0;
      if (valid == kRepackRows) {
        for (int v = 0; v < kVectors; ++v) hn::StoreU(acc[t][p][v], d, o + v * kLanes);
      } else {
        for (int v = 0; v < kVectors; ++v) hn::StoreU(acc[t][p][v], d, result + v * kLanes);
        std::copy(result, result + valid, o);
      }
    }
  }
}

// The last `rest` (< kTileRows) activation rows in one tile of that many: each weight column
// is loaded and widened once for all of them, not once a row (a verification step's few
// rows, a small batch's decodes).
template <TensorType kType, int NP, int R = kTileRows - 1>
HWY_INLINE void panel_rest(int rest, const RepackedWeight& w, std::int64_t g0, const float* x,
                           std::int64_t x_stride, float* out, std::int64_t out_stride) {
  if constexpr (R >= 1) {
    if (rest == R) return panel_tile<kType, R, NP>(w, g0, x, x_stride, out, out_stride);
    panel_rest<kType, NP, R - 1>(rest, w, g0, x, x_stride, out, out_stride);
  }
}

// Every activation row against groups [g0, g0 + NP).
template <TensorType kType, int NP>
HWY_INLINE void panel_columns(const RepackedWeight& w, std::int64_t g0, const float* x,
                              std::int64_t x_stride, std::int64_t num_x, float* out,
                              std::int64_t out_stride) {
  std::int64_t t = 0;
  for (; t + kTileRows <= num_x; t += kTileRows) {
    panel_tile<kType, kTileRows, NP>(w, g0, x + t * x_stride, x_stride, out + t * out_stride,
                                     out_stride);
  }
  if (t < num_x) {
    panel_rest<kType, NP>(static_cast<int>(num_x - t), w, g0, x + t * x_stride, x_stride,
                          out + t * out_stride, out_stride);
  }
}

template <TensorType kType>
void panels_matmul(const RepackedWeight& w, const float* x, std::int64_t x_stride,
                   std::int64_t num_x, std::int64_t g_begin, std::int64_t g_end, float* out,
                   std::int64_t out_stride) {
  std::int64_t g = g_begin;
  if (num_x == 1) {
    for (; g + kDecodePanels <= g_end; g += kDecodePanels) {
      panel_tile<kType, 1, kDecodePanels>(w, g, x, x_stride, out, out_stride);
    }
  } else {
    // Weight-stationary: a few panels (48 rows x cols) stay in the L1/L2 cache while every
    // activation row passes over them.
    for (; g + kPanels <= g_end; g += kPanels) {
      panel_columns<kType, kPanels>(w, g, x, x_stride, num_x, out, out_stride);
    }
  }
  for (; g < g_end; ++g) panel_columns<kType, 1>(w, g, x, x_stride, num_x, out, out_stride);
}

void FloatPanelsMatmul(const RepackedWeight& w, const float* x, std::int64_t x_stride,
                       std::int64_t num_x, std::int64_t g_begin, std::int64_t g_end, float* out,
                       std::int64_t out_stride) {
  switch (w.type) {
    case TensorType::f32:
      return panels_matmul<TensorType::f32>(w, x, x_stride, num_x, g_begin, g_end, out, out_stride);
    case TensorType::f16:
      return panels_matmul<TensorType::f16>(w, x, x_stride, num_x, g_begin, g_end, out, out_stride);
    default:
      return panels_matmul<TensorType::bf16>(w, x, x_stride, num_x, g_begin, g_end, out,
                                             out_stride);
  }
}

bool FloatPanelsFused() {
  return HWY_NATIVE_FMA != 0;
}

}  // namespace troupe::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace troupe::cpu {

HWY_EXPORT(FloatPanelsMatmul);
HWY_EXPORT(FloatPanelsFused);

namespace {

std::size_t element_bytes(gguf::TensorType type) {
  return type == gguf::TensorType::f32 ? 4 : 2;
}

float element(const RepackedWeight& w, std::int64_t g, std::int64_t k, std::int64_t r) {
  const std::byte* at = w.group(g) + (k * kRepackRows + r) * element_bytes(w.type);
  if (w.type == gguf::TensorType::f32) {
    float v;
    std::memcpy(&v, at, 4);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, at, 2);
  return w.type == gguf::TensorType::f16 ? gguf::f16_to_f32(bits) : gguf::bf16_to_f32(bits);
}

}  // namespace

bool has_float_panels(gguf::TensorType type) {
  return type == gguf::TensorType::f32 || type == gguf::TensorType::f16 ||
         type == gguf::TensorType::bf16;
}

RepackedWeight allocate_float_panels(gguf::TensorType type, std::int64_t rows, std::int64_t cols) {
  TROUPE_ASSERT(has_float_panels(type) && rows > 0 && cols > 0,
                "float panels for a type or shape without them");
  RepackedWeight w;
  w.type = type;
  w.rows = rows;
  w.cols = cols;
  w.groups = (rows + kRepackRows - 1) / kRepackRows;
  w.group_bytes = static_cast<std::size_t>(cols * kRepackRows) * element_bytes(type);
  const std::size_t bytes = (w.bytes() + 63) / 64 * 64;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) throw std::bad_alloc();
  w.data.reset(p);
  return w;
}

void repack_float_group(RepackedWeight& into, const std::byte* w, std::size_t w_row_bytes,
                        std::int64_t g) {
  const std::size_t e = element_bytes(into.type);
  std::byte* dst = into.data.get() + g * into.group_bytes;
  std::memset(dst, 0, into.group_bytes);
  for (std::int64_t r = 0; r < kRepackRows; ++r) {
    const std::int64_t row = g * kRepackRows + r;
    if (row >= into.rows) break;  // zero: the row's products are 0, and never written out
    const std::byte* src = w + row * w_row_bytes;
    for (std::int64_t k = 0; k < into.cols; ++k) {
      std::memcpy(dst + (k * kRepackRows + r) * e, src + k * e, e);
    }
  }
}

void float_panels_matmul(const RepackedWeight& w, const float* x, std::int64_t x_stride,
                         std::int64_t num_x, std::int64_t g_begin, std::int64_t g_end, float* out,
                         std::int64_t out_stride) {
  HWY_DYNAMIC_DISPATCH(FloatPanelsMatmul)(w, x, x_stride, num_x, g_begin, g_end, out, out_stride);
}

void float_panels_reference(const RepackedWeight& w, const float* x, std::int64_t x_stride,
                            std::int64_t num_x, std::int64_t g_begin, std::int64_t g_end,
                            float* out, std::int64_t out_stride) {
  for (std::int64_t g = g_begin; g < g_end; ++g) {
    for (std::int64_t r = 0; r < kRepackRows; ++r) {
      const std::int64_t row = g * kRepackRows + r;
      if (row >= w.rows) break;
      for (std::int64_t t = 0; t < num_x; ++t) {
        float acc = 0.0f;
        for (std::int64_t k = 0; k < w.cols; ++k) {
          acc = std::fma(x[t * x_stride + k], element(w, g, k, r), acc);
        }
        out[t * out_stride + row] = acc;
      }
    }
  }
}

bool float_panels_fused() {
  return HWY_DYNAMIC_DISPATCH(FloatPanelsFused)();
}

}  // namespace troupe::cpu
#endif  // HWY_ONCE
