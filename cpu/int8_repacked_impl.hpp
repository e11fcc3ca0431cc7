// The repacked int8 kernel (int8_repack.hpp), written once over a small set of vector
// operations (`Ops`, 16 lanes: one 512-bit register, or two 256-bit halves) that each
// instruction set's file defines before including this one, inside its own namespace
// (int8_repacked_<isa>.cpp). A tile is 16 weight rows (the lanes) by NT <= Ops::kMaxNT
// activation rows. Every path computes each (activation row, weight row) pair by the same
// operations as repacked_matmul_reference: the integer sums are exact (VNNI's vpdpbusd, or
// AVX2's pmaddubsw + pmaddwd where u <= 63 keeps the pair sums from saturating), the float
// work is one conversion, multiply and fma a block in the same order.
//
// Ops (V: 16 int32 lanes, or 64 bytes; F: 16 floats): kMaxNT, zero_i(), zero_f(), load(p),
//   bytes(c), set1_32(i), set1(f), four(p): four activation bytes in every lane,
//   dot(acc, u, x): acc + the sum of each lane's four u * x byte products, and_, or_,
//   shr(v, n), shl(v, n): 16-bit lane shifts, bit_to_4(v, bit), shuffle(table, idx),
//   iq4_table(), mxfp4_table(), cvt(V) -> F, mul, fma(a, b, c) = a * b + c, neg(F),
//   floats16(p), halves16(p), nibbles16_lo(p), nibbles16_hi(p): 16 bytes' low or high
//   nibbles as floats,
//   bytes16_u(p), bytes16_i(p): 16 f16 / u8 / i8 values as floats, store(p, F, rows).

#include <cstring>
#include <vector>

#include "cpu/prefetch.hpp"

namespace troupe::cpu::TROUPE_REPACK_NAMESPACE {

namespace {

using gguf::TensorType;
using O = Ops;
using V = Ops::V;
using F = Ops::F;

// What the tile reads of the activations besides their bytes, per row: the integer offset
// correction per block (-offset * sum q) and, for the minimums, s * sum q per block of 32.
struct Prepared {
  const std::int32_t* corr = nullptr;  // [num_x, blocks]
  const float* sums = nullptr;         // [num_x, cols / 32] (Q2_K: cols / 16)
  std::int64_t blocks = 0;             // per row
};

template <TensorType kType, int NT>
void tile(const std::uint8_t* group, std::int64_t units, const Int8Rows& x, std::int64_t t0,
          const Prepared& prep, float* out, std::int64_t out_stride, int rows) {
  const std::int64_t cols = x.cols;
  const std::int8_t* xq[NT];
  const float* xs[NT];
  for (int t = 0; t < NT; ++t) {
    xq[t] = x.q + (t0 + t) * cols;
    xs[t] = x.lane_scales + (t0 + t) * (cols / 4);
  }
  F acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = O::zero_f();
  const V low4 = O::bytes(0x0F);
  const V bit4 = O::bytes(0x10);
  const V table = kType == TensorType::mxfp4 ? O::mxfp4_table() : O::iq4_table();
  constexpr RepackLayout layout = repack_layout(kType);
  for (std::int64_t u = 0; u < units; ++u) {
    const std::uint8_t* unit = group + u * layout.unit_bytes;
    // The bytes a few units ahead: the hardware prefetcher alone left decode (one activation
    // row, the weights streamed once) at a quarter of the memory's bandwidth here.
    for (std::size_t line = 0; line < layout.unit_bytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(unit + kPrefetchBytes + line), _MM_HINT_T0);
    }
    if constexpr (kType == TensorType::q8_0) {
      const F d = O::halves16(unit);
      V ai[NT];
      for (int t = 0; t < NT; ++t) ai[t] = O::set1_32(prep.corr[(t0 + t) * prep.blocks + u]);
      for (int j = 0; j < 8; ++j) {
        const V wv = O::load(unit + 32 + 64 * j);
        for (int t = 0; t < NT; ++t) {
          ai[t] = O::dot(ai[t], wv, O::four(xq[t] + 32 * u + 4 * j));
        }
      }
      for (int t = 0; t < NT; ++t) {
        const F scale = O::mul(d, O::set1(xs[t][8 * u]));
        acc[t] = O::fma(O::cvt(ai[t]), scale, acc[t]);
      }
    } else if constexpr (is_repacked_nibbles32(kType)) {
      constexpr Block32Layout kFile = block32_layout(kType);
      constexpr bool kMin = kFile.min != 0, kHigh = kFile.high_bits != 0;
      const F d = kFile.e8m0 ? O::floats16(unit) : O::halves16(unit);
      const std::uint8_t* nibbles = unit + (kMin || kFile.e8m0 ? 64 : 32);
      V high = O::zero_i();
      if constexpr (kHigh) high = O::load(nibbles + 256);
      V ai[NT];
      for (int t = 0; t < NT; ++t) {
        ai[t] = kMin ? O::zero_i() : O::set1_32(prep.corr[(t0 + t) * prep.blocks + u]);
      }
      for (int j = 0; j < 4; ++j) {
        const V raw = O::load(nibbles + 64 * j);
        V lo = O::and_(raw, low4);
        V hi = O::and_(O::shr(raw, 4), low4);
        if constexpr (kFile.table != nullptr) {
          lo = O::shuffle(table, lo);
          hi = O::shuffle(table, hi);
        }
        if constexpr (kHigh) {
          lo = O::or_(lo, O::and_(O::bit_to_4(high, 2 * j), bit4));
          hi = O::or_(hi, O::and_(O::bit_to_4(high, 2 * j + 1), bit4));
        }
        for (int t = 0; t < NT; ++t) {
          ai[t] = O::dot(ai[t], lo, O::four(xq[t] + 32 * u + 4 * j));
          ai[t] = O::dot(ai[t], hi, O::four(xq[t] + 32 * u + 16 + 4 * j));
        }
      }
      for (int t = 0; t < NT; ++t) {
        const F scale = O::mul(d, O::set1(xs[t][8 * u]));
        acc[t] = O::fma(O::cvt(ai[t]), scale, acc[t]);
      }
      if constexpr (kMin) {
        const F m = O::halves16(unit + 32);
        for (int t = 0; t < NT; ++t) {
          acc[t] = O::fma(m, O::set1(prep.sums[(t0 + t) * (cols / 32) + u]), acc[t]);
        }
      }
    } else if constexpr (kType == TensorType::q4_k || kType == TensorType::q5_k) {
      const F d = O::halves16(unit);
      const F neg_dmin = O::neg(O::halves16(unit + 32));
      for (int j = 0; j < 8; ++j) {
        const F dsc = O::mul(d, O::bytes16_u(unit + 64 + 16 * j));
        const F c = O::mul(neg_dmin, O::bytes16_u(unit + 192 + 16 * j));
        V ai[NT];
        for (int t = 0; t < NT; ++t) ai[t] = O::zero_i();
        const std::uint8_t* qs = unit + 320 + 64 * 8 * (j / 2);
        for (int l = 0; l < 8; ++l) {
          const V raw = O::load(qs + 64 * l);
          V w = j % 2 == 0 ? O::and_(raw, low4) : O::and_(O::shr(raw, 4), low4);
          if constexpr (kType == TensorType::q5_k) {
            w = O::or_(w, O::and_(O::bit_to_4(O::load(unit + 2368 + 64 * l), j), bit4));
          }
          for (int t = 0; t < NT; ++t) {
            ai[t] = O::dot(ai[t], w, O::four(xq[t] + 256 * u + 32 * j + 4 * l));
          }
        }
        const std::int64_t block = 8 * u + j;
        for (int t = 0; t < NT; ++t) {
          const F scale = O::mul(dsc, O::set1(xs[t][8 * block]));
          acc[t] = O::fma(O::cvt(ai[t]), scale, acc[t]);
          acc[t] = O::fma(c, O::set1(prep.sums[(t0 + t) * (cols / 32) + block]), acc[t]);
        }
      }
    } else if constexpr (kType == TensorType::iq4_xs) {
      const F d = O::halves16(unit);
      for (int b = 0; b < 8; ++b) {
        const F dsc = O::mul(d, O::bytes16_i(unit + 32 + 16 * b));
        const std::int64_t block = 8 * u + b;
        V ai[NT];
        for (int t = 0; t < NT; ++t) {
          ai[t] = O::set1_32(prep.corr[(t0 + t) * prep.blocks + block]);
        }
        for (int j = 0; j < 4; ++j) {
          const V raw = O::load(unit + 160 + 256 * b + 64 * j);
          const V lo = O::shuffle(table, O::and_(raw, low4));
          const V hi = O::shuffle(table, O::and_(O::shr(raw, 4), low4));
          for (int t = 0; t < NT; ++t) {
            ai[t] = O::dot(ai[t], lo, O::four(xq[t] + 32 * block + 4 * j));
            ai[t] = O::dot(ai[t], hi, O::four(xq[t] + 32 * block + 16 + 4 * j));
          }
        }
        for (int t = 0; t < NT; ++t) {
          const F scale = O::mul(dsc, O::set1(xs[t][8 * block]));
          acc[t] = O::fma(O::cvt(ai[t]), scale, acc[t]);
        }
      }
    } else if constexpr (kType == TensorType::q2_k || kType == TensorType::q3_k) {
      constexpr bool kQ2 = kType == TensorType::q2_k;
      const F d = O::halves16(unit);
      F neg_dmin = O::zero_f();
      if constexpr (kQ2) neg_dmin = O::neg(O::halves16(unit + 32));
      const std::uint8_t* lows = unit + low2_at(kType);
      const V three = O::bytes(3), one = O::bytes(1);
      for (int i = 0; i < 16; ++i) {
        F dsc, c = O::zero_f();
        if constexpr (kQ2) {
          dsc = O::mul(d, O::nibbles16_lo(unit + 64 + 16 * i));
          c = O::mul(neg_dmin, O::nibbles16_hi(unit + 64 + 16 * i));
        } else {
          dsc = O::mul(d, O::bytes16_i(unit + 32 + 16 * i));
        }
        const V a = O::load(lows + 64 * i);
        V w[4];
        for (int q = 0; q < 4; ++q) w[q] = O::and_(O::shr(a, 2 * q), three);
        if constexpr (!kQ2) {
          V h = O::load(unit + kQ3HighBitsAt + 64 * (i / 2));
          if (i % 2 != 0) h = O::shr(h, 4);
          for (int q = 0; q < 4; ++q) w[q] = O::or_(w[q], O::shl(O::and_(O::shr(h, q), one), 2));
        }
        const std::int64_t block = 16 * u + i;  // of 16 values
        V ai[NT];
        for (int t = 0; t < NT; ++t) {
          ai[t] = kQ2 ? O::zero_i() : O::set1_32(prep.corr[(t0 + t) * prep.blocks + block]);
          for (int q = 0; q < 4; ++q) {
            ai[t] = O::dot(ai[t], w[q], O::four(xq[t] + 16 * block + 4 * q));
          }
        }
        for (int t = 0; t < NT; ++t) {
          const F scale = O::mul(dsc, O::set1(xs[t][8 * (block / 2)]));
          acc[t] = O::fma(O::cvt(ai[t]), scale, acc[t]);
          if constexpr (kQ2) {
            acc[t] = O::fma(c, O::set1(prep.sums[(t0 + t) * (cols / 16) + block]), acc[t]);
          }
        }
      }
    } else {  // q6_k
      const F d = O::halves16(unit);
      const V top2 = O::bytes(0x30);
      for (int i = 0; i < 16; ++i) {
        const F dsc = O::mul(d, O::bytes16_i(unit + 32 + 16 * i));
        const std::uint8_t* sub = unit + 288 + 192 * i;
        const V a = O::load(sub), b = O::load(sub + 64), c = O::load(sub + 128);
        const V w[4] = {O::or_(O::and_(a, low4), O::and_(O::shl(c, 4), top2)),
                        O::or_(O::and_(O::shr(a, 4), low4), O::and_(O::shl(c, 2), top2)),
                        O::or_(O::and_(b, low4), O::and_(c, top2)),
                        O::or_(O::and_(O::shr(b, 4), low4), O::and_(O::shr(c, 2), top2))};
        const std::int64_t block = 16 * u + i;  // of 16 values
        V ai[NT];
        for (int t = 0; t < NT; ++t) {
          ai[t] = O::set1_32(prep.corr[(t0 + t) * prep.blocks + block]);
          for (int q = 0; q < 4; ++q) {
            ai[t] = O::dot(ai[t], w[q], O::four(xq[t] + 16 * block + 4 * q));
          }
        }
        for (int t = 0; t < NT; ++t) {
          const F scale = O::mul(dsc, O::set1(xs[t][8 * (block / 2)]));
          acc[t] = O::fma(O::cvt(ai[t]), scale, acc[t]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t) O::store(out + (t0 + t) * out_stride, acc[t], rows);
}

// The last n < kMaxNT activation rows, as one tile of n.
template <TensorType kType, int N>
void tail(int n, const std::uint8_t* group, std::int64_t units, const Int8Rows& x, std::int64_t t0,
          const Prepared& prep, float* out, std::int64_t out_stride, int rows) {
  if constexpr (N > 0) {
    if (n == N) {
      tile<kType, N>(group, units, x, t0, prep, out, out_stride, rows);
    } else {
      tail<kType, N - 1>(n, group, units, x, t0, prep, out, out_stride, rows);
    }
  }
}

template <TensorType kType>
void run(const RepackedWeight& w, const Int8Rows& x, std::int64_t num_x, std::int64_t g_begin,
         std::int64_t g_end, const Prepared& prep, float* out, std::int64_t out_stride) {
  const std::int64_t units = w.cols / repack_layout(kType).unit_values;
  for (std::int64_t g = g_begin; g < g_end; ++g) {
    const auto* group = reinterpret_cast<const std::uint8_t*>(w.group(g));
    const std::int64_t left = w.rows - g * kRepackRows;
    const int rows = static_cast<int>(left >= 16 ? 16 : left);
    float* o = out + g * kRepackRows;
    std::int64_t t = 0;
    for (; t + O::kMaxNT <= num_x; t += O::kMaxNT) {
      tile<kType, O::kMaxNT>(group, units, x, t, prep, o, out_stride, rows);
    }
    tail<kType, O::kMaxNT - 1>(static_cast<int>(num_x - t), group, units, x, t, prep, o, out_stride,
                               rows);
  }
}

}  // namespace

void repacked_matmul(const RepackedWeight& w, const Int8Rows& x, std::int64_t num_x,
                     std::int64_t g_begin, std::int64_t g_end, float* out,
                     std::int64_t out_stride) {
  // Per activation row, once per call: the offset's share of each block's integer sum, or
  // (Q4_K) the scaled sums the minimums multiply.
  thread_local std::vector<std::int32_t> corr;
  thread_local std::vector<float> sums;
  const std::int64_t groups16 = x.cols / 16;
  Prepared prep;
  const int offset = repack_offset(w.type);
  const RepackLayout layout = repack_layout(w.type);
  if (layout.sum_values == 16 && offset != 0) {  // Q6_K, Q3_K
    prep.blocks = groups16;
    corr.resize(static_cast<std::size_t>(num_x * prep.blocks));
    for (std::int64_t t = 0; t < num_x; ++t) {
      for (std::int64_t b = 0; b < prep.blocks; ++b) {
        corr[t * prep.blocks + b] = -offset * x.int_sums[t * groups16 + b];
      }
    }
    prep.corr = corr.data();
  } else if (offset != 0) {
    prep.blocks = x.cols / 32;
    corr.resize(static_cast<std::size_t>(num_x * prep.blocks));
    for (std::int64_t t = 0; t < num_x; ++t) {
      const std::int32_t* is = x.int_sums + t * groups16;
      for (std::int64_t b = 0; b < prep.blocks; ++b) {
        corr[t * prep.blocks + b] = -offset * (is[2 * b] + is[2 * b + 1]);
      }
    }
    prep.corr = corr.data();
  } else if (layout.sum_values == 16) {  // Q2_K: minimums per 16, s * sum q of each
    sums.resize(static_cast<std::size_t>(num_x * groups16));
    for (std::int64_t t = 0; t < num_x; ++t) {
      for (std::int64_t b = 0; b < groups16; ++b) {
        const float s = x.lane_scales[t * (x.cols / 4) + 8 * (b / 2)];
        sums[t * groups16 + b] = s * static_cast<float>(x.int_sums[t * groups16 + b]);
      }
    }
    prep.sums = sums.data();
  } else {  // minimums: Q4_1, Q5_1, Q4_K, Q5_K
    const std::int64_t blocks = x.cols / 32;
    sums.resize(static_cast<std::size_t>(num_x * blocks));
    for (std::int64_t t = 0; t < num_x; ++t) {
      const std::int32_t* is = x.int_sums + t * groups16;
      for (std::int64_t b = 0; b < blocks; ++b) {
        const float s = x.lane_scales[t * (x.cols / 4) + 8 * b];
        sums[t * blocks + b] = s * static_cast<float>(is[2 * b] + is[2 * b + 1]);
      }
    }
    prep.sums = sums.data();
  }
  switch (w.type) {
    case TensorType::q8_0:
      return run<TensorType::q8_0>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::q4_0:
      return run<TensorType::q4_0>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::q4_1:
      return run<TensorType::q4_1>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::q5_0:
      return run<TensorType::q5_0>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::q5_1:
      return run<TensorType::q5_1>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::iq4_nl:
      return run<TensorType::iq4_nl>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::mxfp4:
      return run<TensorType::mxfp4>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::q4_k:
      return run<TensorType::q4_k>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::q5_k:
      return run<TensorType::q5_k>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::iq4_xs:
      return run<TensorType::iq4_xs>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::q2_k:
      return run<TensorType::q2_k>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::q3_k:
      return run<TensorType::q3_k>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    default:
      return run<TensorType::q6_k>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
  }
}

}  // namespace troupe::cpu::TROUPE_REPACK_NAMESPACE
