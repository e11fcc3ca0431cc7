// The int8 matmul, written once over a small set of vector operations (`Ops`) that each
// instruction set's file defines before including this one, inside its own namespace
// (int8_matmul_<isa>.cpp): the same code is compiled once per instruction set.
//
// The math. A chunk is 256 values of a row: one super-block (the K-quants, IQ4_XS), or 8
// blocks of 32. Every weight type is decoded, per chunk, to unsigned bytes u (Q8_0: signed)
// with
//   w = a * u + c,
// where a (a float) is constant over each lane of 4 values and c (the offset: -8d for Q4_0,
// -16d for Q5_0, m for Q4_1 and Q5_1, -dmin*m for the K-quants' minimums, -32d*sc for Q6_K,
// -4d*sc for Q3_K) over each group of 16. With the activation x = s * q (s the scale of q's
// block of 32):
//   dot(w, x) = sum over lanes of (a * s) * idot(u, q) + sum over groups of c * (s * sum q),
// idot being exact in int32. Each (activation row, weight row) pair keeps one float vector
// accumulator and adds these terms chunk by chunk in a fixed order; the lanes are summed at
// the end. The order depends on nothing but the pair, so a row's result is the same in any
// tile and any batch.
//
// Table types (IQ4_NL, IQ4_XS, MXFP4) look each nibble up in a 16-byte table of their levels
// (a byte shuffle). MXFP4's levels (-12..12) are stored + 12, so u <= 24 and c = -12d. IQ4's
// (-127..113) are stored + 128 (c = -128 * a, ggml's trick) where the path's idot takes any
// unsigned byte exactly (vpdpbusd; plain C++); AVX2's pmaddubsw would saturate its 16-bit
// pair sums at u = 241, so there they stay signed and go through dot_fma_signed as Q8_0 does.
//
// Ops (Unit: 64 bytes of a chunk; Acc: 16 floats, one per lane of 4 values):
//   kWideUnsignedBytes: whether dot_fma is exact for every unsigned byte (else u <= 63),
//   zero(), set1(f), load(const float*), mul, fma(a, b, c) = a * b + c, sum(Acc) -> float,
//   half(f16 bits) -> float, halves8(8 f16 bits) -> lanes 0-7, bytes_i8(i8[16]) -> 16 lanes,
//   e8m0_halves8(8 bytes of a little-endian word) -> 2^(e - 128) of each in lanes 0-7,
//   words_u8(w0..w3): the 16 bytes of four little-endian words -> 16 lanes,
//   lanes8(s0, s1): s0 in lanes 0-7, s1 in lanes 8-15,
//   spread8(s, k): s[2k] in lanes 0-7, s[2k+1] in lanes 8-15,
//   spread4(s, k): s[4k + i] in lanes 4i..4i+3,
//   pairs_low(s): s[i / 2] in lane i; pairs_high(s): s[8 + i / 2] in lane i,
//   load_x(q): 64 int8 activations, bytes2x32(p0, p1): 32 bytes from each,
//   nibbles32(p): low nibbles of p[0..32) then their high nibbles,
//   nibbles16x2(p0, p1): low then high nibbles of p0[0..16), then of p1[0..16),
//   crumbs32(p, shift): bits shift, shift+1 of p[0..32), then bits shift+2, shift+3,
//   lookup16(u, table): each byte of u (0-15) replaced by table[byte],
//   with_high_bits<v>(u, qh, bit): u's first 32 bytes += v * bit `bit` of qh[0..32), its last
//     32 += v * bit `bit + 1` (v 16: Q5_K's fifth bits; 4: Q3_K's third),
//   high_bits_2x32(u, qh0, qh1): byte i of u's first 32 += 16 * bit i of the word qh0, byte i
//     of its last 32 += 16 * bit i of qh1,
//   q6(ql, qh, high, shift): (nibble of ql[0..32)) | ((qh >> shift) & 3) << 4, then
//     (nibble of ql[32..64)) | ((qh >> shift + 2) & 3) << 4, the nibble high or low,
//   dot_fma(acc, u, q, scale): acc + float(idot per lane of unsigned u and signed q) * scale,
//   dot_fma_signed(acc, w, q, scale): the same with signed w.

#include <cstring>

#include "cpu/prefetch.hpp"

namespace troupe::cpu::TROUPE_INT8_NAMESPACE {

using gguf::TensorType;

inline constexpr std::int64_t kChunk = 256;

// One weight row's chunk, decoded.
struct ChunkWeights {
  Ops::Unit u[4];
  Ops::Acc a[4];  // per lane of 4 values
  Ops::Acc c;     // per group of 16 values (lane g: group g)
};

// Q4_K and Q5_K pack eight 6-bit scales and eight 6-bit minimums into 12 bytes; this
// unpacks them to 16 bytes (scales then minimums, as four words) with a few word operations,
// as ggml does. Kept in registers: a vector load of bytes just stored word by word would
// stall on store forwarding.
struct ScalesMins {
  std::uint32_t w[4];
};
inline ScalesMins k_scales_mins(const std::uint8_t* packed) {
  constexpr std::uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  std::uint32_t w0, w1, w2;
  std::memcpy(&w0, packed, 4);
  std::memcpy(&w1, packed + 4, 4);
  std::memcpy(&w2, packed + 8, 4);
  return {{w0 & kLow6,                                          // scales 0-3
           (w2 & kLow4) | (((w0 >> 6) & kLow2) << 4),           // scales 4-7
           w1 & kLow6,                                          // minimums 0-3
           ((w2 >> 4) & kLow4) | (((w1 >> 6) & kLow2) << 4)}};  // minimums 4-7
}

// IQ4's levels stay signed where the path's byte products are not exact for all of u.
template <TensorType kType>
inline constexpr bool kSignedTable = (kType == TensorType::iq4_nl || kType == TensorType::iq4_xs) &&
                                     !Ops::kWideUnsignedBytes;

template <TensorType kType>
inline constexpr bool kSigned = kType == TensorType::q8_0 || kSignedTable<kType>;

// What a table type adds to its levels to make them the bytes u (see the math above).
template <TensorType kType>
inline constexpr int kTableOffset = kType == TensorType::mxfp4 ? 12
                                    : kSignedTable<kType>      ? 0
                                                               : 128;

template <TensorType kType>
inline constexpr const std::int8_t* kLevels =
    kType == TensorType::mxfp4 ? gguf::kMxfp4Values : gguf::kIq4NlValues;

// A table type's 16 levels as the bytes u the kernel multiplies (levels + kTableOffset).
template <TensorType kType>
struct LevelTable {
  std::uint8_t bytes[16];
  constexpr LevelTable() : bytes{} {
    for (int i = 0; i < 16; ++i) {
      bytes[i] = static_cast<std::uint8_t>(kLevels<kType>[i] + kTableOffset<kType>);
    }
  }
};
template <TensorType kType>
inline constexpr LevelTable<kType> kLevelTable{};

// Bytes a chunk of 256 values takes.
template <TensorType kType>
constexpr std::size_t chunk_bytes() {
  if constexpr (is_block32(kType)) {
    return 8 * block32_layout(kType).bytes;
  } else {
    switch (kType) {
      case TensorType::q2_k:
        return 84;
      case TensorType::q3_k:
        return 110;
      case TensorType::q4_k:
        return 144;
      case TensorType::q5_k:
        return 176;
      case TensorType::iq4_xs:
        return 136;
      default:  // q6_k
        return 210;
    }
  }
}
template <TensorType kType>
inline constexpr std::size_t kChunkBytes = chunk_bytes<kType>();

inline std::uint32_t load_u32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// An f16 field of a chunk's 8 blocks of 32 (the scales d, or Q4_1's and Q5_1's minimums m at
// p + 2), in lanes 0-7.
template <std::size_t kBlockBytes>
inline Ops::Acc block_scales(const std::uint8_t* p) {
  std::uint16_t h[8];
  for (int b = 0; b < 8; ++b) std::memcpy(&h[b], p + b * kBlockBytes, 2);
  return Ops::halves8(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
}

// Four of IQ4_XS's 6-bit block scales as the bytes of a word: `nibbles` holds their low 4 bits
// (4 each), `crumbs` their top 2 (2 each). In registers, as k_scales_mins.
inline std::uint32_t iq4_xs_scale_bytes(std::uint32_t nibbles, std::uint32_t crumbs) {
  std::uint32_t low = (nibbles & 0x00FF) | (nibbles & 0xFF00) << 8;  // bytes 0, 2: two nibbles
  low = (low & 0x000F000F) | (low & 0x00F000F0) << 4;                // one nibble a byte
  std::uint32_t top = (crumbs & 0x0F) | (crumbs & 0xF0) << 12;       // bytes 0, 2: two crumbs
  top = (top & 0x00030003) | (top & 0x000C000C) << 6;                // one crumb a byte
  return low | top << 4;
}

template <TensorType kType>
inline void decode_chunk(const std::uint8_t* p, ChunkWeights& cw) {
  if constexpr (kType == TensorType::q8_0) {
    const Ops::Acc d = block_scales<34>(p);
    for (int k = 0; k < 4; ++k) {
      cw.u[k] = Ops::bytes2x32(p + 2 * k * 34 + 2, p + (2 * k + 1) * 34 + 2);
      cw.a[k] = Ops::spread8(d, k);
    }
    cw.c = Ops::zero();
  } else if constexpr (is_block32(kType)) {  // Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4
    // u: the 4 or 5 bits, or the table's bytes; a: d per block; c: m, or -offset * d, per
    // block's two groups of 16.
    constexpr Block32Layout kLayout = block32_layout(kType);
    Ops::Acc d;
    if constexpr (kLayout.e8m0) {
      std::uint64_t exponents = 0;
      for (int b = 0; b < 8; ++b) exponents |= std::uint64_t{p[b * kLayout.bytes]} << (8 * b);
      d = Ops::e8m0_halves8(exponents);
    } else {
      d = block_scales<kLayout.bytes>(p);
    }
    for (int k = 0; k < 4; ++k) {
      const std::uint8_t* first = p + 2 * k * kLayout.bytes;
      const std::uint8_t* second = first + kLayout.bytes;
      cw.u[k] = Ops::nibbles16x2(first + kLayout.quants, second + kLayout.quants);
      if constexpr (kLayout.table != nullptr) {
        cw.u[k] = Ops::lookup16(cw.u[k], kLevelTable<kType>.bytes);
      }
      if constexpr (kLayout.high_bits != 0) {
        cw.u[k] = Ops::high_bits_2x32(cw.u[k], load_u32(first + kLayout.high_bits),
                                      load_u32(second + kLayout.high_bits));
      }
      cw.a[k] = Ops::spread8(d, k);
    }
    if constexpr (kLayout.min != 0) {
      cw.c = Ops::pairs_low(block_scales<kLayout.bytes>(p + kLayout.min));
    } else if constexpr (kLayout.table != nullptr) {
      cw.c = Ops::mul(Ops::pairs_low(d), Ops::set1(-static_cast<float>(kTableOffset<kType>)));
    } else {
      cw.c = Ops::mul(Ops::pairs_low(d), Ops::set1(-static_cast<float>(kLayout.offset)));
    }
  } else if constexpr (kType == TensorType::q2_k) {
    // scales[16] (scale | minimum << 4 per group of 16), qs[64], d, dmin.
    const std::uint8_t* qs = p + 16;
    std::uint16_t d_bits, dmin_bits;
    std::memcpy(&d_bits, p + 80, 2);
    std::memcpy(&dmin_bits, p + 82, 2);
    constexpr std::uint32_t kLow4 = 0x0f0f0f0f;
    const std::uint32_t w[4] = {load_u32(p), load_u32(p + 4), load_u32(p + 8), load_u32(p + 12)};
    const Ops::Acc s =
        Ops::mul(Ops::words_u8(w[0] & kLow4, w[1] & kLow4, w[2] & kLow4, w[3] & kLow4),
                 Ops::set1(Ops::half(d_bits)));
    for (int k = 0; k < 4; ++k) {
      cw.u[k] = Ops::crumbs32(qs + 32 * (k / 2), 4 * (k % 2));
      cw.a[k] = Ops::spread4(s, k);
    }
    cw.c = Ops::mul(Ops::words_u8((w[0] >> 4) & kLow4, (w[1] >> 4) & kLow4, (w[2] >> 4) & kLow4,
                                  (w[3] >> 4) & kLow4),
                    Ops::set1(-Ops::half(dmin_bits)));
  } else if constexpr (kType == TensorType::q3_k) {
    // hmask[32], qs[64], sixteen 6-bit scales in 12 bytes, d: w = d * (scale - 32) * (u - 4)
    // with u the 2 bits plus 4 for the third.
    const std::uint8_t* hmask = p;
    const std::uint8_t* qs = p + 32;
    std::uint16_t d_bits;
    std::memcpy(&d_bits, p + 108, 2);
    const float d = Ops::half(d_bits);
    // The scales' bytes as four words (ggml's unpacking): low nibbles from the first 8 bytes,
    // the top 2 bits from the last 4.
    constexpr std::uint32_t kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
    const std::uint32_t a0 = load_u32(p + 96), a1 = load_u32(p + 100), top = load_u32(p + 104);
    const Ops::Acc stored =
        Ops::words_u8((a0 & kLow4) | (top & kLow2) << 4, (a1 & kLow4) | ((top >> 2) & kLow2) << 4,
                      ((a0 >> 4) & kLow4) | ((top >> 4) & kLow2) << 4,
                      ((a1 >> 4) & kLow4) | ((top >> 6) & kLow2) << 4);
    // d * (stored - 32): exact either way (6 bits times f16's 11), so the scalar decoder's.
    const Ops::Acc s = Ops::fma(stored, Ops::set1(d), Ops::set1(-32.0f * d));
    for (int k = 0; k < 4; ++k) {
      cw.u[k] = Ops::with_high_bits<4>(Ops::crumbs32(qs + 32 * (k / 2), 4 * (k % 2)), hmask, 2 * k);
      cw.a[k] = Ops::spread4(s, k);
    }
    cw.c = Ops::mul(s, Ops::set1(-4.0f));
  } else if constexpr (kType == TensorType::iq4_xs) {
    // d, scales_h, scales_l[4], qs[128]: 8 blocks of 32 with 6-bit scales (stored + 32).
    std::uint16_t d_bits, high;
    std::memcpy(&d_bits, p, 2);
    std::memcpy(&high, p + 2, 2);
    const float d = Ops::half(d_bits);
    const std::uint32_t low = load_u32(p + 4);
    const Ops::Acc stored = Ops::words_u8(iq4_xs_scale_bytes(low & 0xFFFF, high & 0xFF),
                                          iq4_xs_scale_bytes(low >> 16, high >> 8), 0, 0);
    const Ops::Acc s = Ops::fma(stored, Ops::set1(d), Ops::set1(-32.0f * d));  // lanes 0-7
    const std::uint8_t* qs = p + 8;
    for (int k = 0; k < 4; ++k) {
      cw.u[k] =
          Ops::lookup16(Ops::nibbles16x2(qs + 32 * k, qs + 32 * k + 16), kLevelTable<kType>.bytes);
      cw.a[k] = Ops::spread8(s, k);
    }
    cw.c = Ops::mul(Ops::pairs_low(s), Ops::set1(-static_cast<float>(kTableOffset<kType>)));
  } else if constexpr (kType == TensorType::q4_k || kType == TensorType::q5_k) {
    std::uint16_t d_bits, dmin_bits;
    std::memcpy(&d_bits, p, 2);
    std::memcpy(&dmin_bits, p + 2, 2);
    // Lanes 0-7: d * scale of sub-block j; lanes 8-15: -dmin * minimum of sub-block j.
    const ScalesMins sm = k_scales_mins(p + 4);
    const Ops::Acc s = Ops::mul(Ops::words_u8(sm.w[0], sm.w[1], sm.w[2], sm.w[3]),
                                Ops::lanes8(Ops::half(d_bits), -Ops::half(dmin_bits)));
    const std::uint8_t* qh = p + 16;                                     // Q5_K: [32]
    const std::uint8_t* qs = p + (kType == TensorType::q4_k ? 16 : 48);  // [128]
    for (int k = 0; k < 4; ++k) {
      cw.u[k] = Ops::nibbles32(qs + 32 * k);
      if constexpr (kType == TensorType::q5_k)
        cw.u[k] = Ops::with_high_bits<16>(cw.u[k], qh, 2 * k);
      cw.a[k] = Ops::spread8(s, k);
    }
    cw.c = Ops::pairs_high(s);
  } else {  // q6_k: ql [128], qh [64], int8 scales [16] (one per 16 values), d
    const std::uint8_t* ql = p;
    const std::uint8_t* qh = p + 128;
    std::uint16_t d_bits;
    std::memcpy(&d_bits, p + 208, 2);
    const Ops::Acc s = Ops::mul(Ops::bytes_i8(reinterpret_cast<const std::int8_t*>(p + 192)),
                                Ops::set1(Ops::half(d_bits)));
    for (int half = 0; half < 2; ++half) {
      cw.u[2 * half] = Ops::q6(ql + 64 * half, qh + 32 * half, false, 0);
      cw.u[2 * half + 1] = Ops::q6(ql + 64 * half, qh + 32 * half, true, 4);
    }
    for (int k = 0; k < 4; ++k) cw.a[k] = Ops::spread4(s, k);
    cw.c = Ops::mul(s, Ops::set1(-32.0f));
  }
}

// NT activation rows (from t0) x NR weight rows, written to out[t * out_stride + r].
template <TensorType kType, int NT, int NR>
inline void tile(const Int8Rows& x, std::int64_t t0, const std::uint8_t* w, std::size_t w_row_bytes,
                 float* out, std::int64_t out_stride) {
  const std::int64_t cols = x.cols;
  const std::int64_t num_chunks = cols / kChunk;
  Ops::Acc acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r) acc[t][r] = Ops::zero();
  ChunkWeights cw[NR];
  for (std::int64_t ch = 0; ch < num_chunks; ++ch) {
    for (int r = 0; r < NR; ++r) {
      const std::uint8_t* chunk = w + r * w_row_bytes + ch * kChunkBytes<kType>;
      // The row's bytes a few chunks ahead: a decode row streams several weight rows at
      // once, more than the hardware prefetcher keeps in flight.
      for (std::size_t line = 0; line < kChunkBytes<kType>; line += 64) {
        __builtin_prefetch(chunk + kPrefetchBytes + line);
      }
      decode_chunk<kType>(chunk, cw[r]);
    }
    for (int t = 0; t < NT; ++t) {
      const std::int64_t row = t0 + t;
      const std::int8_t* q = x.q + row * cols + ch * kChunk;
      const float* ls = x.lane_scales + row * (cols / 4) + ch * (kChunk / 4);
      Ops::Unit xq[4];
      Ops::Acc xs[4];
      for (int k = 0; k < 4; ++k) {
        xq[k] = Ops::load_x(q + 64 * k);
        xs[k] = Ops::load(ls + 16 * k);
      }
      const Ops::Acc sums = Ops::load(x.sums + row * (cols / 16) + ch * (kChunk / 16));
      for (int r = 0; r < NR; ++r) {
        Ops::Acc a = acc[t][r];
        for (int k = 0; k < 4; ++k) {
          const Ops::Acc scale = Ops::mul(cw[r].a[k], xs[k]);
          if constexpr (kSigned<kType>) {
            a = Ops::dot_fma_signed(a, cw[r].u[k], xq[k], scale);
          } else {
            a = Ops::dot_fma(a, cw[r].u[k], xq[k], scale);
          }
        }
        if constexpr (!kSigned<kType>) a = Ops::fma(cw[r].c, sums, a);
        acc[t][r] = a;
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < NR; ++r) {
      float sum = Ops::sum(acc[t][r]);
      if constexpr (is_block32(kType)) {
        if (cols % kChunk != 0) {
          const std::int64_t row = t0 + t;
          sum += int8_tail_dot(kType, reinterpret_cast<const std::byte*>(w + r * w_row_bytes),
                               x.q + row * cols, x.lane_scales + row * (cols / 4), cols);
        }
      }
      out[t * out_stride + r] = sum;
    }
  }
}

template <TensorType kType>
void matmul(const Int8Rows& x, std::int64_t num_x, const std::uint8_t* w, std::size_t w_row_bytes,
            std::int64_t num_w, float* out, std::int64_t out_stride) {
  constexpr int NT = 4, NR = 2;
  std::int64_t t = 0;
  for (; t + NT <= num_x; t += NT) {
    std::int64_t r = 0;
    for (; r + NR <= num_w; r += NR) {
      tile<kType, NT, NR>(x, t, w + r * w_row_bytes, w_row_bytes, out + t * out_stride + r,
                          out_stride);
    }
    for (; r < num_w; ++r) {
      tile<kType, NT, 1>(x, t, w + r * w_row_bytes, w_row_bytes, out + t * out_stride + r,
                         out_stride);
    }
  }
  // Two or three rows left (a small batch, or an expert's few rows): each weight chunk is
  // decoded once for all of them, not once a row.
  if (const std::int64_t rest = num_x - t; rest == 2 || rest == 3) {
    const auto rows = [&]<int N>() {
      std::int64_t r = 0;
      for (; r + NR <= num_w; r += NR) {
        tile<kType, N, NR>(x, t, w + r * w_row_bytes, w_row_bytes, out + t * out_stride + r,
                           out_stride);
      }
      for (; r < num_w; ++r) {
        tile<kType, N, 1>(x, t, w + r * w_row_bytes, w_row_bytes, out + t * out_stride + r,
                          out_stride);
      }
    };
    if (rest == 2) {
      rows.template operator()<2>();
    } else {
      rows.template operator()<3>();
    }
    return;
  }
  for (; t < num_x; ++t) {
    std::int64_t r = 0;
    for (; r + 4 <= num_w; r += 4) {
      tile<kType, 1, 4>(x, t, w + r * w_row_bytes, w_row_bytes, out + t * out_stride + r,
                        out_stride);
    }
    for (; r < num_w; ++r) {
      tile<kType, 1, 1>(x, t, w + r * w_row_bytes, w_row_bytes, out + t * out_stride + r,
                        out_stride);
    }
  }
}

void int8_matmul(TensorType type, const Int8Rows& x, std::int64_t num_x, const std::byte* w,
                 std::size_t w_row_bytes, std::int64_t num_w, float* out, std::int64_t out_stride) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(w);
  switch (type) {
    case TensorType::q8_0:
      return matmul<TensorType::q8_0>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::q4_0:
      return matmul<TensorType::q4_0>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::q4_1:
      return matmul<TensorType::q4_1>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::q5_0:
      return matmul<TensorType::q5_0>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::q5_1:
      return matmul<TensorType::q5_1>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::q4_k:
      return matmul<TensorType::q4_k>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::q5_k:
      return matmul<TensorType::q5_k>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::q2_k:
      return matmul<TensorType::q2_k>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::q3_k:
      return matmul<TensorType::q3_k>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::iq4_nl:
      return matmul<TensorType::iq4_nl>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::iq4_xs:
      return matmul<TensorType::iq4_xs>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    case TensorType::mxfp4:
      return matmul<TensorType::mxfp4>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
    default:
      return matmul<TensorType::q6_k>(x, num_x, bytes, w_row_bytes, num_w, out, out_stride);
  }
}

}  // namespace troupe::cpu::TROUPE_INT8_NAMESPACE
