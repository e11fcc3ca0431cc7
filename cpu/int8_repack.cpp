#include "cpu/int8_repack.hpp"

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "gguf/dequantize.hpp"
#include "gguf/half.hpp"
#include "troupe/result.hpp"

namespace troupe::cpu {

using gguf::TensorType;

#if defined(__x86_64__) && defined(TROUPE_INT8_X86)
#define TROUPE_DECLARE_REPACK_PATH(ns)                                                 \
  namespace ns {                                                                       \
  void repacked_matmul(const RepackedWeight& w, const Int8Rows& x, std::int64_t num_x, \
                       std::int64_t g_begin, std::int64_t g_end, float* out,           \
                       std::int64_t out_stride);                                       \
  }
TROUPE_DECLARE_REPACK_PATH(int8_avx2)
TROUPE_DECLARE_REPACK_PATH(int8_avx_vnni)
TROUPE_DECLARE_REPACK_PATH(int8_avx512)
#undef TROUPE_DECLARE_REPACK_PATH
namespace int8_avx512 {
double peak_macs_per_second(double seconds);
}  // namespace int8_avx512
#endif

namespace {

// Whether pmaddubsw's 16-bit pair sums stay exact: every u <= 63.
bool small_bytes(TensorType type) {
  // (MXFP4's u = level + 12 <= 24.)
  return type != TensorType::q8_0 && type != TensorType::iq4_nl && type != TensorType::iq4_xs;
}

}  // namespace

std::vector<Int8Path> repacked_paths(TensorType type) {
  std::vector<Int8Path> paths;
  if (repack_layout(type).unit_values == 0) return paths;
#if defined(__x86_64__) && defined(TROUPE_INT8_X86)
  if (int8_path_supported(Int8Path::avx2) && small_bytes(type)) paths.push_back(Int8Path::avx2);
  if (int8_path_supported(Int8Path::avx_vnni)) paths.push_back(Int8Path::avx_vnni);
  if (int8_path_supported(Int8Path::avx512_vnni)) paths.push_back(Int8Path::avx512_vnni);
#endif
  return paths;
}

bool repacked_kernel_available(TensorType type) {
  return !repacked_paths(type).empty();
}

double int8_peak_macs_per_second(double seconds) {
#if defined(__x86_64__) && defined(TROUPE_INT8_X86)
  if (int8_path_supported(Int8Path::avx512_vnni)) return int8_avx512::peak_macs_per_second(seconds);
#endif
  (void)seconds;
  return 0.0;
}

// A group's unit (a block of 32 or a super-block of 256, for 16 rows), by type:
//   Q8_0: d[16] f16 | quants: for lanes j < 8, for rows r < 16, bytes q[4j..4j+4) + 128
//   Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: d[16] f16 | (Q4_1, Q5_1) m[16] f16 | nibbles: for j < 4,
//         for r, the file's bytes qs[4j..4j+4) (low nibbles: values 4j.., high: 16 + 4j..)
//         | (Q5_0, Q5_1) fifth bits: byte 4r + i holds bit 2j = value 4j + i's, bit 2j + 1 =
//         value 16 + 4j + i's
//   Q4_K, Q5_K: d[16], dmin[16] f16 | scales[8][16], mins[8][16] (6-bit, a byte each,
//         [sub-block][row]) | for pairs k < 4, for j < 8, for r: qs[32k + 4j..+4) (low
//         nibbles: sub-block 2k, high: 2k + 1) | (Q5_K) for j < 8, for r: qh[4j..4j+4) (bit
//         s: sub-block s's fifth bit)
//   IQ4_XS: d[16] f16 | scales[8][16] (int8, the stored 6 bits - 32) | for blocks b < 8, for
//         j < 4, for r: qs[16b + 4j..+4) (low nibbles: values 32b + 4j.., high: 32b + 16 + 4j..)
//   MXFP4: d[16] float32 (its E8M0 scale halved) | nibbles as Q4_0's (levels through a table)
//   Q6_K: d[16] f16 | scales[16][16] int8 | for sub-blocks i < 16 of 16 values: A, B, C of 64
//         bytes, byte 4r + b of each: A = u(16i+b) & 15 | (u(16i+4+b) & 15) << 4,
//         B = the same for 16i+8+b and 16i+12+b, C = the four values' top two bits, in order
//   Q2_K: d[16], dmin[16] f16 | scale | min << 4 [16][16] (the file's bytes, [sub-block][row])
//         | at low2_at: for sub-blocks i < 16, byte 4r + b: bits 2q, 2q + 1 = value
//         16i + 4q + b's two bits
//   Q3_K: d[16] f16 | scales[16][16] int8 (the stored 6 bits - 32) | the two low bits as
//         Q2_K's | at kQ3HighBitsAt: for k < 8, byte 4r + b: bit q = value 32k + 4q + b's
//         third bit, bit 4 + q = value 32k + 16 + 4q + b's
bool can_repack(TensorType type, std::int64_t cols) {
  const RepackLayout layout = repack_layout(type);
  return layout.unit_values != 0 && cols > 0 && cols % layout.unit_values == 0;
}

void RepackedWeight::Free::operator()(std::byte* p) const {
  std::free(p);
}

RepackedWeight allocate_repacked(TensorType type, std::int64_t rows, std::int64_t cols) {
  TROUPE_ASSERT(can_repack(type, cols), "repacking a type or width without a repacked layout");
  const RepackLayout layout = repack_layout(type);
  RepackedWeight w;
  w.type = type;
  w.rows = rows;
  w.cols = cols;
  w.groups = (rows + kRepackRows - 1) / kRepackRows;
  w.group_bytes = static_cast<std::size_t>(cols / layout.unit_values) * layout.unit_bytes;
  const std::size_t bytes = (w.bytes() + 63) / 64 * 64;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, bytes));
  if (p == nullptr) throw std::bad_alloc();
  w.data.reset(p);
  return w;
}

namespace {

// Where a blocks-of-32 unit's nibbles lie (past d and m).
constexpr std::size_t nibbles_at(TensorType type) {
  return block32_layout(type).min != 0 || block32_layout(type).e8m0 ? 64 : 32;
}

void repack_unit(TensorType type, const std::uint8_t* src, std::uint8_t* dst, int r) {
  if (is_repacked_nibbles32(type)) {
    const Block32Layout file = block32_layout(type);
    if (file.e8m0) {
      const float d = gguf::e8m0_half_to_f32(src[0]);
      std::memcpy(dst + 4 * r, &d, 4);
    } else {
      std::memcpy(dst + 2 * r, src, 2);
    }
    if (file.min != 0) std::memcpy(dst + 32 + 2 * r, src + file.min, 2);
    std::uint8_t* nibbles = dst + nibbles_at(type);
    for (int j = 0; j < 4; ++j) std::memcpy(nibbles + 64 * j + 4 * r, src + file.quants + 4 * j, 4);
    if (file.high_bits != 0) {
      std::uint32_t qh;
      std::memcpy(&qh, src + file.high_bits, 4);
      for (int i = 0; i < 4; ++i) {
        std::uint8_t bits = 0;
        for (int j = 0; j < 4; ++j) {
          bits |= static_cast<std::uint8_t>(((qh >> (4 * j + i)) & 1) << (2 * j));
          bits |= static_cast<std::uint8_t>(((qh >> (16 + 4 * j + i)) & 1) << (2 * j + 1));
        }
        nibbles[256 + 4 * r + i] = bits;
      }
    }
    return;
  }
  switch (type) {
    case TensorType::q8_0:
      std::memcpy(dst + 2 * r, src, 2);
      for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 4; ++i) dst[32 + 64 * j + 4 * r + i] = src[2 + 4 * j + i] ^ 0x80;
      }
      return;
    case TensorType::q4_k:
    case TensorType::q5_k: {
      const std::uint8_t* qs = src + (type == TensorType::q4_k ? 16 : 48);
      std::memcpy(dst + 2 * r, src, 2);
      std::memcpy(dst + 32 + 2 * r, src + 2, 2);
      for (int j = 0; j < 8; ++j) {
        gguf::k_scale_min(j, src + 4, dst[64 + 16 * j + r], dst[192 + 16 * j + r]);
      }
      for (int k = 0; k < 4; ++k) {
        for (int j = 0; j < 8; ++j) {
          std::memcpy(dst + 320 + 64 * (8 * k + j) + 4 * r, qs + 32 * k + 4 * j, 4);
        }
      }
      if (type == TensorType::q5_k) {
        for (int j = 0; j < 8; ++j) std::memcpy(dst + 2368 + 64 * j + 4 * r, src + 16 + 4 * j, 4);
      }
      return;
    }
    case TensorType::iq4_xs: {
      std::memcpy(dst + 2 * r, src, 2);
      std::uint16_t high;
      std::memcpy(&high, src + 2, 2);
      for (int b = 0; b < 8; ++b) {
        const int stored =
            ((src[4 + b / 2] >> (4 * (b % 2))) & 0xF) | (((high >> (2 * b)) & 3) << 4);
        dst[32 + 16 * b + r] = static_cast<std::uint8_t>(static_cast<std::int8_t>(stored - 32));
        for (int j = 0; j < 4; ++j) {
          std::memcpy(dst + 160 + 256 * b + 64 * j + 4 * r, src + 8 + 16 * b + 4 * j, 4);
        }
      }
      return;
    }
    case TensorType::q2_k:
    case TensorType::q3_k: {
      const bool q2 = type == TensorType::q2_k;
      const std::uint8_t* qs = src + (q2 ? 16 : 32);
      // Value v's two low bits: bits 2j of byte v % 32 of its half's 32 bytes.
      const auto low2 = [&](int v) {
        return (qs[32 * (v / 128) + v % 32] >> (2 * (v % 128 / 32))) & 3;
      };
      std::uint8_t* lows = dst + low2_at(type);
      if (q2) {
        std::memcpy(dst + 2 * r, src + 80, 2);
        std::memcpy(dst + 32 + 2 * r, src + 82, 2);
        for (int i = 0; i < 16; ++i) dst[64 + 16 * i + r] = src[i];  // scale | min << 4
      } else {
        std::memcpy(dst + 2 * r, src + 108, 2);
        int scales[16];
        gguf::q3_k_scales(src + 96, scales);
        for (int i = 0; i < 16; ++i) {
          dst[32 + 16 * i + r] = static_cast<std::uint8_t>(static_cast<std::int8_t>(scales[i]));
        }
      }
      for (int i = 0; i < 16; ++i) {
        for (int b = 0; b < 4; ++b) {
          int byte = 0;
          for (int q = 0; q < 4; ++q) byte |= low2(16 * i + 4 * q + b) << (2 * q);
          lows[64 * i + 4 * r + b] = static_cast<std::uint8_t>(byte);
        }
      }
      if (!q2) {  // the third bits: Q3_K's hmask, bit v / 32 of byte v % 32
        const auto high = [&](int v) { return (src[v % 32] >> (v / 32)) & 1; };
        for (int k = 0; k < 8; ++k) {
          for (int b = 0; b < 4; ++b) {
            int byte = 0;
            for (int q = 0; q < 4; ++q) {
              byte |= high(32 * k + 4 * q + b) << q;
              byte |= high(32 * k + 16 + 4 * q + b) << (4 + q);
            }
            dst[kQ3HighBitsAt + 64 * k + 4 * r + b] = static_cast<std::uint8_t>(byte);
          }
        }
      }
      return;
    }
    default: {  // q6_k
      std::memcpy(dst + 2 * r, src + 208, 2);
      for (int i = 0; i < 16; ++i) dst[32 + 16 * i + r] = src[192 + i];
      std::uint8_t u[256];
      gguf::q6_k_quants(src, u);
      for (int i = 0; i < 16; ++i) {
        std::uint8_t* sub = dst + 288 + 192 * i;
        const std::uint8_t* v = u + 16 * i;
        for (int b = 0; b < 4; ++b) {
          sub[4 * r + b] = static_cast<std::uint8_t>((v[b] & 15) | (v[4 + b] & 15) << 4);
          sub[64 + 4 * r + b] = static_cast<std::uint8_t>((v[8 + b] & 15) | (v[12 + b] & 15) << 4);
          sub[128 + 4 * r + b] = static_cast<std::uint8_t>(
              v[b] >> 4 | (v[4 + b] >> 4) << 2 | (v[8 + b] >> 4) << 4 | (v[12 + b] >> 4) << 6);
        }
      }
      return;
    }
  }
}

// A table type's level for a nibble, as the unsigned byte the kernel multiplies (IQ4's
// + 128, MXFP4's + 12).
int table_u(TensorType type, int nibble) {
  if (type == TensorType::mxfp4) return gguf::kMxfp4Values[nibble] + 12;
  return gguf::kIq4NlValues[nibble] + 128;
}

// Row r's unsigned u of value v in a unit (the kernel subtracts repack_offset from each).
int unit_u(TensorType type, const std::uint8_t* unit, int r, int v) {
  if (is_repacked_nibbles32(type)) {
    const std::uint8_t* nibbles = unit + nibbles_at(type);
    const int j = v % 16 / 4, i = v % 4;
    const std::uint8_t byte = nibbles[64 * j + 4 * r + i];
    const int nibble = v < 16 ? byte & 15 : byte >> 4;
    if (block32_layout(type).table != nullptr) return table_u(type, nibble);
    if (block32_layout(type).high_bits == 0) return nibble;
    return nibble | ((nibbles[256 + 4 * r + i] >> (2 * j + (v < 16 ? 0 : 1))) & 1) << 4;
  }
  switch (type) {
    case TensorType::q8_0:
      return unit[32 + 64 * (v / 4) + 4 * r + v % 4];
    case TensorType::q4_k:
    case TensorType::q5_k: {
      const int sub = v / 32, k = sub / 2, j = v % 32 / 4;
      const std::uint8_t byte = unit[320 + 64 * (8 * k + j) + 4 * r + v % 4];
      const int nibble = sub % 2 == 0 ? byte & 15 : byte >> 4;
      if (type == TensorType::q4_k) return nibble;
      return nibble | ((unit[2368 + 64 * j + 4 * r + v % 4] >> sub) & 1) << 4;
    }
    case TensorType::iq4_xs: {
      const int b = v / 32, w = v % 32, j = w % 16 / 4;
      const std::uint8_t byte = unit[160 + 256 * b + 64 * j + 4 * r + w % 4];
      return table_u(type, w < 16 ? byte & 15 : byte >> 4);
    }
    case TensorType::q2_k:
    case TensorType::q3_k: {
      const int i = v / 16, q = v % 16 / 4, b = v % 4;
      const int low = (unit[low2_at(type) + 64 * i + 4 * r + b] >> (2 * q)) & 3;
      if (type == TensorType::q2_k) return low;
      return low | ((unit[kQ3HighBitsAt + 64 * (i / 2) + 4 * r + b] >> (4 * (i % 2) + q)) & 1) << 2;
    }
    default: {  // q6_k
      const int i = v / 16, within = v % 16, quarter = within / 4, b = within % 4;
      const std::uint8_t* sub = unit + 288 + 192 * i;
      const std::uint8_t nibbles = sub[(quarter < 2 ? 0 : 64) + 4 * r + b];
      const int low = quarter % 2 == 0 ? nibbles & 15 : nibbles >> 4;
      const int high = (sub[128 + 4 * r + b] >> (2 * quarter)) & 3;
      return low | high << 4;
    }
  }
}

float f16_at(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return gguf::f16_to_f32(bits);
}

}  // namespace

void repack_group(RepackedWeight& into, const std::byte* w, std::size_t w_row_bytes,
                  std::int64_t g) {
  const RepackLayout layout = repack_layout(into.type);
  const std::int64_t units = into.cols / layout.unit_values;
  const std::size_t src_unit_bytes = w_row_bytes / static_cast<std::size_t>(units);
  auto* dst = reinterpret_cast<std::uint8_t*>(into.data.get()) + g * into.group_bytes;
  std::memset(dst, 0, into.group_bytes);
  for (int r = 0; r < kRepackRows; ++r) {
    const std::int64_t row = g * kRepackRows + r;
    if (row >= into.rows) break;  // zero: scales 0, so the row's products are 0
    const auto* src = reinterpret_cast<const std::uint8_t*>(w) + row * w_row_bytes;
    for (std::int64_t u = 0; u < units; ++u) {
      repack_unit(into.type, src + u * src_unit_bytes, dst + u * layout.unit_bytes, r);
    }
  }
}

void repacked_matmul_reference(const RepackedWeight& w, const Int8Rows& x, std::int64_t num_x,
                               std::int64_t g_begin, std::int64_t g_end, float* out,
                               std::int64_t out_stride) {
  const RepackLayout layout = repack_layout(w.type);
  const std::int64_t units = w.cols / layout.unit_values;
  const int offset = repack_offset(w.type);
  // Blocks: what one int32 sum covers.
  const int block = layout.sum_values;
  for (std::int64_t g = g_begin; g < g_end; ++g) {
    const auto* group = reinterpret_cast<const std::uint8_t*>(w.group(g));
    for (int r = 0; r < kRepackRows; ++r) {
      const std::int64_t row = g * kRepackRows + r;
      if (row >= w.rows) break;
      for (std::int64_t t = 0; t < num_x; ++t) {
        float acc = 0.0f;
        for (std::int64_t u = 0; u < units; ++u) {
          const std::uint8_t* unit = group + u * layout.unit_bytes;
          for (int b0 = 0; b0 < layout.unit_values; b0 += block) {
            const std::int64_t col = u * layout.unit_values + b0;  // the block's first value
            std::int32_t dot = 0;
            for (int v = b0; v < b0 + block; ++v) {
              dot += unit_u(w.type, unit, r, v) * x.q[t * x.cols + u * layout.unit_values + v];
            }
            std::int32_t sum_q = 0;
            for (int h = 0; h < block / 16; ++h)
              sum_q += x.int_sums[t * (x.cols / 16) + col / 16 + h];
            dot -= offset * sum_q;
            const float s = x.lane_scales[t * (x.cols / 4) + col / 32 * 8];
            float a = 0.0f, c = 0.0f;
            bool has_min = false;
            if (w.type == TensorType::mxfp4) {
              std::memcpy(&a, unit + 4 * r, 4);
            } else if (w.type == TensorType::q8_0 || is_repacked_nibbles32(w.type)) {
              a = f16_at(unit + 2 * r);
              if (block32_layout(w.type).min != 0) {
                has_min = true;
                c = f16_at(unit + 32 + 2 * r);
              }
            } else if (w.type == TensorType::q4_k || w.type == TensorType::q5_k) {
              a = f16_at(unit + 2 * r) * static_cast<float>(unit[64 + 16 * (b0 / 32) + r]);
              has_min = true;
              c = -f16_at(unit + 32 + 2 * r) * static_cast<float>(unit[192 + 16 * (b0 / 32) + r]);
            } else if (w.type == TensorType::iq4_xs) {
              a = f16_at(unit + 2 * r) *
                  static_cast<float>(static_cast<std::int8_t>(unit[32 + 16 * (b0 / 32) + r]));
            } else if (w.type == TensorType::q2_k) {
              const std::uint8_t packed = unit[64 + 16 * (b0 / 16) + r];
              a = f16_at(unit + 2 * r) * static_cast<float>(packed & 15);
              has_min = true;
              c = -f16_at(unit + 32 + 2 * r) * static_cast<float>(packed >> 4);
            } else {  // q6_k, q3_k
              a = f16_at(unit + 2 * r) *
                  static_cast<float>(static_cast<std::int8_t>(unit[32 + 16 * (b0 / 16) + r]));
            }
            acc = std::fma(static_cast<float>(dot), a * s, acc);
            if (has_min) acc = std::fma(c, s * static_cast<float>(sum_q), acc);
          }
        }
        out[t * out_stride + row] = acc;
      }
    }
  }
}

void repacked_matmul_on(Int8Path path, const RepackedWeight& w, const Int8Rows& x,
                        std::int64_t num_x, std::int64_t g_begin, std::int64_t g_end, float* out,
                        std::int64_t out_stride) {
  switch (path) {
#if defined(__x86_64__) && defined(TROUPE_INT8_X86)
    case Int8Path::avx512_vnni:
      return int8_avx512::repacked_matmul(w, x, num_x, g_begin, g_end, out, out_stride);
    case Int8Path::avx_vnni:
      return int8_avx_vnni::repacked_matmul(w, x, num_x, g_begin, g_end, out, out_stride);
    case Int8Path::avx2:
      TROUPE_ASSERT(small_bytes(w.type), "the AVX2 repacked kernel on bytes over 63");
      return int8_avx2::repacked_matmul(w, x, num_x, g_begin, g_end, out, out_stride);
#endif
    default:
      return repacked_matmul_reference(w, x, num_x, g_begin, g_end, out, out_stride);
  }
}

void repacked_matmul(const RepackedWeight& w, const Int8Rows& x, std::int64_t num_x,
                     std::int64_t g_begin, std::int64_t g_end, float* out,
                     std::int64_t out_stride) {
  // The fastest path of each type, found once.
  static const auto best = [] {
    std::array<Int8Path, 64> by_type{};
    for (std::size_t t = 0; t < by_type.size(); ++t) {
      const auto paths = repacked_paths(static_cast<TensorType>(t));
      by_type[t] = paths.empty() ? Int8Path::portable : paths.back();
    }
    return by_type;
  }();
  const auto index = static_cast<std::size_t>(w.type);
  repacked_matmul_on(index < best.size() ? best[index] : Int8Path::portable, w, x, num_x, g_begin,
                     g_end, out, out_stride);
}

void int8_product(TensorType type, const RepackedWeight* packed, const std::byte* w,
                  std::size_t w_row_bytes, const Int8Rows& x, std::int64_t num_x, std::int64_t r0,
                  std::int64_t rows, float* out, std::int64_t out_stride) {
  if (packed == nullptr) {
    int8_matmul(type, x, num_x, w + r0 * w_row_bytes, w_row_bytes, rows, out, out_stride);
    return;
  }
  TROUPE_ASSERT(
      r0 % kRepackRows == 0 && ((r0 + rows) % kRepackRows == 0 || r0 + rows == packed->rows),
      "a repacked product over rows that are not whole groups");
  repacked_matmul(*packed, x, num_x, r0 / kRepackRows, (r0 + rows + kRepackRows - 1) / kRepackRows,
                  out - r0, out_stride);
}

}  // namespace troupe::cpu
