// The repacked int8 kernel (int8_repack.hpp) on AVX-512 VNNI: a tile of 16 weight rows (the
// lanes of one register) by NT <= 8 activation rows. Built with the AVX-512 flags; run only
// where the processor has them (int8_repack.cpp checks).
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

// GCC 12's AVX-512 headers build some results on `__m256d __Y = __Y;` (an intended
// undefined value), which -Werror=uninitialized rejects once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "cpu/int8_repack.hpp"

namespace troupe::cpu::int8_avx512 {

namespace {

using gguf::TensorType;

inline constexpr std::size_t kPrefetchBytes = 4096;

// Four activation bytes in every lane.
inline __m512i four(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline __m512i load(const std::uint8_t* p) {
  return _mm512_loadu_si512(p);
}

inline __m512 halves16(const std::uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline __m512 bytes16_u(const std::uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline __m512 bytes16_i(const std::uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Bit `bit` of every byte moved to bit 4 (the other bits are the caller's to mask off).
inline __m512i bit_to_4(__m512i h, int bit) {
  return bit < 4 ? _mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - bit))
                 : _mm512_srl_epi16(h, _mm_cvtsi32_si128(bit - 4));
}

// IQ4's 16 levels + 128, in every 128-bit lane (for vpshufb).
inline __m512i iq4_table() {
  alignas(16) std::uint8_t bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<std::uint8_t>(gguf::kIq4NlValues[i] + 128);
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes)));
}

// What the tile reads of the activations besides their bytes, per row: the integer offset
// correction per block (-offset * sum q) and, for Q4_K's minimums, s * sum q per block of 32.
struct Prepared {
  const std::int32_t* corr = nullptr;  // [num_x, blocks]
  const float* sums = nullptr;         // [num_x, cols / 32] (Q4_K)
  std::int64_t blocks = 0;             // per row
};

template <TensorType kType, int NT>
void tile(const std::uint8_t* group, std::int64_t units, const Int8Rows& x, std::int64_t t0,
          const Prepared& prep, float* out, std::int64_t out_stride, __mmask16 rows) {
  const std::int64_t cols = x.cols;
  const std::int8_t* xq[NT];
  const float* xs[NT];
  for (int t = 0; t < NT; ++t) {
    xq[t] = x.q + (t0 + t) * cols;
    xs[t] = x.lane_scales + (t0 + t) * (cols / 4);
  }
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i table = iq4_table();
  constexpr RepackLayout layout = repack_layout(kType);
  for (std::int64_t u = 0; u < units; ++u) {
    const std::uint8_t* unit = group + u * layout.unit_bytes;
    // The bytes a few units ahead: the hardware prefetcher alone left decode (one activation
    // row, the weights streamed once) at a quarter of the memory's bandwidth here.
    for (std::size_t line = 0; line < layout.unit_bytes; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(unit + kPrefetchBytes + line), _MM_HINT_T0);
    }
    if constexpr (kType == TensorType::q8_0) {
      const __m512 d = halves16(unit);
      __m512i ai[NT];
      for (int t = 0; t < NT; ++t) ai[t] = _mm512_set1_epi32(prep.corr[(t0 + t) * prep.blocks + u]);
      for (int j = 0; j < 8; ++j) {
        const __m512i wv = load(unit + 32 + 64 * j);
        for (int t = 0; t < NT; ++t) {
          ai[t] = _mm512_dpbusd_epi32(ai[t], wv, four(xq[t] + 32 * u + 4 * j));
        }
      }
      for (int t = 0; t < NT; ++t) {
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xs[t][8 * u]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[t]), scale, acc[t]);
      }
    } else if constexpr (is_repacked_nibbles32(kType)) {
      constexpr Block32Layout kFile = block32_layout(kType);
      constexpr bool kMin = kFile.min != 0, kHigh = kFile.high_bits != 0;
      const __m512 d = halves16(unit);
      const std::uint8_t* nibbles = unit + (kMin ? 64 : 32);
      __m512i high = _mm512_setzero_si512();
      if constexpr (kHigh) high = load(nibbles + 256);
      __m512i ai[NT];
      for (int t = 0; t < NT; ++t) {
        ai[t] = kMin ? _mm512_setzero_si512()
                     : _mm512_set1_epi32(prep.corr[(t0 + t) * prep.blocks + u]);
      }
      for (int j = 0; j < 4; ++j) {
        const __m512i raw = load(nibbles + 64 * j);
        __m512i lo = _mm512_and_si512(raw, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        if constexpr (kFile.table != nullptr) {
          lo = _mm512_shuffle_epi8(table, lo);
          hi = _mm512_shuffle_epi8(table, hi);
        }
        if constexpr (kHigh) {
          lo = _mm512_or_si512(lo, _mm512_and_si512(bit_to_4(high, 2 * j), bit4));
          hi = _mm512_or_si512(hi, _mm512_and_si512(bit_to_4(high, 2 * j + 1), bit4));
        }
        for (int t = 0; t < NT; ++t) {
          ai[t] = _mm512_dpbusd_epi32(ai[t], lo, four(xq[t] + 32 * u + 4 * j));
          ai[t] = _mm512_dpbusd_epi32(ai[t], hi, four(xq[t] + 32 * u + 16 + 4 * j));
        }
      }
      for (int t = 0; t < NT; ++t) {
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xs[t][8 * u]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[t]), scale, acc[t]);
      }
      if constexpr (kMin) {
        const __m512 m = halves16(unit + 32);
        for (int t = 0; t < NT; ++t) {
          acc[t] =
              _mm512_fmadd_ps(m, _mm512_set1_ps(prep.sums[(t0 + t) * (cols / 32) + u]), acc[t]);
        }
      }
    } else if constexpr (kType == TensorType::q4_k || kType == TensorType::q5_k) {
      const __m512 d = halves16(unit);
      const __m512 neg_dmin = _mm512_xor_ps(halves16(unit + 32), _mm512_set1_ps(-0.0f));
      for (int j = 0; j < 8; ++j) {
        const __m512 dsc = _mm512_mul_ps(d, bytes16_u(unit + 64 + 16 * j));
        const __m512 c = _mm512_mul_ps(neg_dmin, bytes16_u(unit + 192 + 16 * j));
        __m512i ai[NT];
        for (int t = 0; t < NT; ++t) ai[t] = _mm512_setzero_si512();
        const std::uint8_t* qs = unit + 320 + 64 * 8 * (j / 2);
        for (int l = 0; l < 8; ++l) {
          const __m512i raw = load(qs + 64 * l);
          __m512i w = j % 2 == 0 ? _mm512_and_si512(raw, low4)
                                 : _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
          if constexpr (kType == TensorType::q5_k) {
            w = _mm512_or_si512(w, _mm512_and_si512(bit_to_4(load(unit + 2368 + 64 * l), j), bit4));
          }
          for (int t = 0; t < NT; ++t) {
            ai[t] = _mm512_dpbusd_epi32(ai[t], w, four(xq[t] + 256 * u + 32 * j + 4 * l));
          }
        }
        const std::int64_t block = 8 * u + j;
        for (int t = 0; t < NT; ++t) {
          const __m512 scale = _mm512_mul_ps(dsc, _mm512_set1_ps(xs[t][8 * block]));
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[t]), scale, acc[t]);
          acc[t] =
              _mm512_fmadd_ps(c, _mm512_set1_ps(prep.sums[(t0 + t) * (cols / 32) + block]), acc[t]);
        }
      }
    } else if constexpr (kType == TensorType::iq4_xs) {
      const __m512 d = halves16(unit);
      for (int b = 0; b < 8; ++b) {
        const __m512 dsc = _mm512_mul_ps(d, bytes16_i(unit + 32 + 16 * b));
        const std::int64_t block = 8 * u + b;
        __m512i ai[NT];
        for (int t = 0; t < NT; ++t) {
          ai[t] = _mm512_set1_epi32(prep.corr[(t0 + t) * prep.blocks + block]);
        }
        for (int j = 0; j < 4; ++j) {
          const __m512i raw = load(unit + 160 + 256 * b + 64 * j);
          const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(raw, low4));
          const __m512i hi =
              _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4));
          for (int t = 0; t < NT; ++t) {
            ai[t] = _mm512_dpbusd_epi32(ai[t], lo, four(xq[t] + 32 * block + 4 * j));
            ai[t] = _mm512_dpbusd_epi32(ai[t], hi, four(xq[t] + 32 * block + 16 + 4 * j));
          }
        }
        for (int t = 0; t < NT; ++t) {
          const __m512 scale = _mm512_mul_ps(dsc, _mm512_set1_ps(xs[t][8 * block]));
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[t]), scale, acc[t]);
        }
      }
    } else {  // q6_k
      const __m512 d = halves16(unit);
      const __m512i top2 = _mm512_set1_epi8(0x30);
      for (int i = 0; i < 16; ++i) {
        const __m512 dsc = _mm512_mul_ps(d, bytes16_i(unit + 32 + 16 * i));
        const std::uint8_t* sub = unit + 288 + 192 * i;
        const __m512i a = load(sub), b = load(sub + 64), c = load(sub + 128);
        const __m512i w[4] = {_mm512_or_si512(_mm512_and_si512(a, low4),
                                              _mm512_and_si512(_mm512_slli_epi16(c, 4), top2)),
                              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), low4),
                                              _mm512_and_si512(_mm512_slli_epi16(c, 2), top2)),
                              _mm512_or_si512(_mm512_and_si512(b, low4), _mm512_and_si512(c, top2)),
                              _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), low4),
                                              _mm512_and_si512(_mm512_srli_epi16(c, 2), top2))};
        const std::int64_t block = 16 * u + i;  // of 16 values
        __m512i ai[NT];
        for (int t = 0; t < NT; ++t) {
          ai[t] = _mm512_set1_epi32(prep.corr[(t0 + t) * prep.blocks + block]);
          for (int q = 0; q < 4; ++q) {
            ai[t] = _mm512_dpbusd_epi32(ai[t], w[q], four(xq[t] + 16 * block + 4 * q));
          }
        }
        for (int t = 0; t < NT; ++t) {
          const __m512 scale = _mm512_mul_ps(dsc, _mm512_set1_ps(xs[t][8 * (block / 2)]));
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[t]), scale, acc[t]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(out + (t0 + t) * out_stride, rows, acc[t]);
}

template <TensorType kType>
void run(const RepackedWeight& w, const Int8Rows& x, std::int64_t num_x, std::int64_t g_begin,
         std::int64_t g_end, const Prepared& prep, float* out, std::int64_t out_stride) {
  const std::int64_t units = w.cols / repack_layout(kType).unit_values;
  for (std::int64_t g = g_begin; g < g_end; ++g) {
    const auto* group = reinterpret_cast<const std::uint8_t*>(w.group(g));
    const std::int64_t left = w.rows - g * kRepackRows;
    const auto rows = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
    float* o = out + g * kRepackRows;
    std::int64_t t = 0;
    for (; t + 8 <= num_x; t += 8) tile<kType, 8>(group, units, x, t, prep, o, out_stride, rows);
    switch (num_x - t) {
      case 7:
        tile<kType, 7>(group, units, x, t, prep, o, out_stride, rows);
        break;
      case 6:
        tile<kType, 6>(group, units, x, t, prep, o, out_stride, rows);
        break;
      case 5:
        tile<kType, 5>(group, units, x, t, prep, o, out_stride, rows);
        break;
      case 4:
        tile<kType, 4>(group, units, x, t, prep, o, out_stride, rows);
        break;
      case 3:
        tile<kType, 3>(group, units, x, t, prep, o, out_stride, rows);
        break;
      case 2:
        tile<kType, 2>(group, units, x, t, prep, o, out_stride, rows);
        break;
      case 1:
        tile<kType, 1>(group, units, x, t, prep, o, out_stride, rows);
        break;
      default:
        break;
    }
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
  if (w.type == TensorType::q6_k) {
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
    case TensorType::q4_k:
      return run<TensorType::q4_k>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::q5_k:
      return run<TensorType::q5_k>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    case TensorType::iq4_xs:
      return run<TensorType::iq4_xs>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
    default:
      return run<TensorType::q6_k>(w, x, num_x, g_begin, g_end, prep, out, out_stride);
  }
}

double peak_macs_per_second(double seconds) {
  // Twelve independent accumulators: enough to cover vpdpbusd's latency on every port.
  constexpr int kChains = 12;
  constexpr std::int64_t kRounds = 1 << 16;
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double elapsed = 0.0, macs = 0.0;
  do {
    for (std::int64_t r = 0; r < kRounds; ++r) {
      for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
      __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]));
    }
    macs += static_cast<double>(kRounds) * kChains * 64;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  __m512i sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  volatile int sink = _mm512_reduce_add_epi32(sum);
  (void)sink;
  return macs / elapsed;
}

}  // namespace troupe::cpu::int8_avx512
