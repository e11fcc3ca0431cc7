#include "gguf/dequantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gguf/half.hpp"
#include "gguf/quantize_ref.hpp"

namespace troupe::gguf {

void k_scale_min(int j, const std::uint8_t* q, std::uint8_t& scale, std::uint8_t& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    min = static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void q6_k_quants(const std::uint8_t* block, std::uint8_t* u) {
  const std::uint8_t* ql = block;
  const std::uint8_t* qh = block + 128;
  for (int n = 0; n < 2; ++n) {
    std::uint8_t* y = u + 128 * n;
    for (int l = 0; l < 32; ++l) {
      y[l] = static_cast<std::uint8_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4));
      y[l + 32] = static_cast<std::uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
      y[l + 64] = static_cast<std::uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      y[l + 96] = static_cast<std::uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
    ql += 64;
    qh += 32;
  }
}

namespace {

std::uint16_t load_u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void dequantize_q4_k(const std::uint8_t* block, float* out) {
  const float d = f16_to_f32(load_u16(block));
  const float dmin = f16_to_f32(load_u16(block + 2));
  const std::uint8_t* scales = block + 4;
  const std::uint8_t* q = block + 16;
  int is = 0;
  for (int j = 0; j < 256; j += 64) {
    std::uint8_t sc, m;
    k_scale_min(is, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    k_scale_min(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *out++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *out++ = d2 * (q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

void dequantize_q5_k(const std::uint8_t* block, float* out) {
  const float d = f16_to_f32(load_u16(block));
  const float dmin = f16_to_f32(load_u16(block + 2));
  const std::uint8_t* scales = block + 4;
  const std::uint8_t* qh = block + 16;
  const std::uint8_t* ql = block + 48;
  int is = 0;
  std::uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < 256; j += 64) {
    std::uint8_t sc, m;
    k_scale_min(is, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    k_scale_min(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *out++ = d1 * ((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *out++ = d2 * ((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 = static_cast<std::uint8_t>(u1 << 2);
    u2 = static_cast<std::uint8_t>(u2 << 2);
  }
}

void dequantize_q6_k(const std::uint8_t* block, float* out) {
  const auto* sc = reinterpret_cast<const std::int8_t*>(block + 192);
  const float d = f16_to_f32(load_u16(block + 208));
  std::uint8_t u[256];
  q6_k_quants(block, u);
  for (int i = 0; i < 256; ++i) out[i] = d * sc[i / 16] * (u[i] - 32);
}

// Q2_K: 16 groups of 16 with a 4-bit scale and minimum each (scales[16], low nibble the
// scale), 2-bit values in qs[64] (values 32j..32j+31 of each half are bits 2j, 2j+1 of its 32
// bytes), then d and dmin: value = d * scale * q - dmin * minimum.
void dequantize_q2_k(const std::uint8_t* block, float* out) {
  const std::uint8_t* scales = block;
  const std::uint8_t* qs = block + 16;
  const float d = f16_to_f32(load_u16(block + 80));
  const float dmin = f16_to_f32(load_u16(block + 82));
  for (int half = 0; half < 2; ++half) {
    const std::uint8_t* q = qs + 32 * half;
    for (int j = 0; j < 4; ++j) {
      for (int g = 0; g < 2; ++g) {  // the two groups of 16 in values 32j..32j+31
        const std::uint8_t sc = scales[8 * half + 2 * j + g];
        const float dl = d * static_cast<float>(sc & 0xF);
        const float ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) {
          *out++ = dl * static_cast<float>((q[16 * g + l] >> (2 * j)) & 3) - ml;
        }
      }
    }
  }
}

}  // namespace

// Q3_K's sixteen 6-bit scales, packed in 12 bytes (low nibbles of scales 0-7 then 8-15 in
// bytes 0-7, the top two bits in bytes 8-11), as signed values (stored + 32).
void q3_k_scales(const std::uint8_t* packed, int* scales) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
    const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
    scales[j] = (low | high << 4) - 32;
  }
}

namespace {

// Q3_K: hmask[32] (value i's third bit: bit i / 32 of byte i % 32), 2-bit values in qs[64]
// laid out as Q2_K's, the 6-bit scales, d: value = d * scale * (q - 4, or q with the bit).
void dequantize_q3_k(const std::uint8_t* block, float* out) {
  const std::uint8_t* hmask = block;
  const std::uint8_t* qs = block + 32;
  int scales[16];
  q3_k_scales(block + 96, scales);
  const float d = f16_to_f32(load_u16(block + 108));
  for (int half = 0; half < 2; ++half) {
    const std::uint8_t* q = qs + 32 * half;
    for (int j = 0; j < 4; ++j) {
      const int bit = 4 * half + j;
      for (int g = 0; g < 2; ++g) {
        const float dl = d * static_cast<float>(scales[8 * half + 2 * j + g]);
        for (int l = 16 * g; l < 16 * g + 16; ++l) {
          const int value = ((q[l] >> (2 * j)) & 3) - ((hmask[l] >> bit) & 1 ? 0 : 4);
          *out++ = dl * static_cast<float>(value);
        }
      }
    }
  }
}

// A block of 32 as 16 bytes of nibbles (value i: the low nibble of byte i for i < 16, the high
// nibble of byte i - 16 after), each selecting a level of `values`, times d.
void dequantize_nibbles_by_table(const std::uint8_t* qs, float d, const std::int8_t* values,
                                 float* out) {
  for (int i = 0; i < 16; ++i) {
    out[i] = d * static_cast<float>(values[qs[i] & 0xF]);
    out[16 + i] = d * static_cast<float>(values[qs[i] >> 4]);
  }
}

// IQ4_XS: d, scales_h (the top 2 bits of 8 six-bit scales), scales_l[4] (their low nibbles),
// then 8 blocks of 32 as IQ4_NL's nibbles: value = d * (scale - 32) * kIq4NlValues[nibble].
void dequantize_iq4_xs(const std::uint8_t* block, float* out) {
  const float d = f16_to_f32(load_u16(block));
  const std::uint16_t scales_h = load_u16(block + 2);
  const std::uint8_t* scales_l = block + 4;
  for (int b = 0; b < 8; ++b) {
    const int scale = ((scales_l[b / 2] >> (4 * (b % 2))) & 0xF) | ((scales_h >> (2 * b)) & 3) << 4;
    dequantize_nibbles_by_table(block + 8 + 16 * b, d * static_cast<float>(scale - 32),
                                kIq4NlValues, out + 32 * b);
  }
}

// The K-quant encoders: simpler than ggml's (no iterative search for the best scale), each
// block's values mapped linearly between its minimum and maximum, so any GGUF reader
// decodes them; for random test and benchmark models, not for converting real weights.
std::uint8_t quantize_scale(float value, float step, int max) {
  if (step == 0.0f) return 0;
  return static_cast<std::uint8_t>(std::clamp(static_cast<int>(std::lround(value / step)), 0, max));
}

// Q4_K (levels 15) and Q5_K (31): 8 sub-blocks of 32 with a 6-bit scale and minimum each.
void quantize_k_super_block(const float* x, int levels, std::uint8_t* block) {
  float scale[8], min[8];
  for (int j = 0; j < 8; ++j) {
    const float* v = x + 32 * j;
    const float lo = std::min(0.0f, *std::min_element(v, v + 32));
    const float hi = std::max(0.0f, *std::max_element(v, v + 32));
    scale[j] = (hi - lo) / static_cast<float>(levels);
    min[j] = -lo;
  }
  const float d = *std::max_element(scale, scale + 8) / 63.0f;
  const float dmin = *std::max_element(min, min + 8) / 63.0f;
  std::uint16_t bits = f32_to_f16(d);
  std::memcpy(block, &bits, 2);
  bits = f32_to_f16(dmin);
  std::memcpy(block + 2, &bits, 2);
  // What the decoder will read back, for the values' rounding.
  const float dq = f16_to_f32(load_u16(block)), dminq = f16_to_f32(load_u16(block + 2));
  std::uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = quantize_scale(scale[j], dq, 63);
    m[j] = quantize_scale(min[j], dminq, 63);
  }
  std::uint8_t* scales = block + 4;
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<std::uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<std::uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  std::uint8_t* qh = block + 16;                        // Q5_K only
  std::uint8_t* qs = block + (levels == 15 ? 16 : 48);  // [128]
  if (levels == 31) std::memset(qh, 0, 32);
  for (int j = 0; j < 8; ++j) {
    const float step = dq * sc[j], offset = dminq * m[j];
    for (int l = 0; l < 32; ++l) {
      const int q = step == 0.0f
                        ? 0
                        : std::clamp(static_cast<int>(std::lround((x[32 * j + l] + offset) / step)),
                                     0, levels);
      // Sub-blocks 2i and 2i+1 share bytes 32i..32i+31: low nibble, high nibble.
      std::uint8_t& byte = qs[32 * (j / 2) + l];
      byte = static_cast<std::uint8_t>(j % 2 == 0 ? (byte & 0xF0) | (q & 0xF)
                                                  : (byte & 0x0F) | ((q & 0xF) << 4));
      if (levels == 31 && q >= 16) qh[l] = static_cast<std::uint8_t>(qh[l] | (1 << j));
    }
  }
}

// Q6_K: 16 groups of 16 with an int8 scale each, values -32..31.
void quantize_q6_k_super_block(const float* x, std::uint8_t* block) {
  float scale[16];
  for (int g = 0; g < 16; ++g) {
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[16 * g + i]));
    scale[g] = amax / 31.0f;
  }
  const float d = *std::max_element(scale, scale + 16) / 127.0f;
  const std::uint16_t bits = f32_to_f16(d);
  std::memcpy(block + 208, &bits, 2);
  const float dq = f16_to_f32(bits);
  auto* sc = reinterpret_cast<std::int8_t*>(block + 192);
  std::uint8_t* ql = block;
  std::uint8_t* qh = block + 128;
  std::memset(block, 0, 192);
  for (int g = 0; g < 16; ++g) {
    sc[g] = static_cast<std::int8_t>(quantize_scale(scale[g], dq, 127));
    const float step = dq * sc[g];
    for (int i = 0; i < 16; ++i) {
      const int e = 16 * g + i;  // element in the super-block
      const int q =
          step == 0.0f ? 32 : std::clamp(static_cast<int>(std::lround(x[e] / step)), -32, 31) + 32;
      // The decoder's layout: halves of 128; in each, element l (< 32) of quarter k comes
      // from ql[l + 32 * (k % 2)] (low nibble for k < 2) and qh[l] bits 2k, 2k+1.
      const int half = e / 128, k = (e % 128) / 32, l = e % 32;
      std::uint8_t& low = ql[64 * half + l + 32 * (k % 2)];
      low = static_cast<std::uint8_t>(low | ((q & 0xF) << (k < 2 ? 0 : 4)));
      qh[32 * half + l] = static_cast<std::uint8_t>(qh[32 * half + l] | ((q >> 4) << (2 * k)));
    }
  }
}

// ggml's reference quantizers of Q4_0, Q4_1, Q5_0 and Q5_1, in the layouts dequantize_row
// reads. With a minimum (Q4_1, Q5_1), m is the block's smallest value and d its range over the
// top level; without, the value of largest magnitude is -8 (Q4_0) or -16 (Q5_0) steps of d.
void quantize_block32(const float* x, TensorType type, std::uint8_t* block) {
  const bool has_min = type == TensorType::q4_1 || type == TensorType::q5_1;
  const bool five_bits = type == TensorType::q5_0 || type == TensorType::q5_1;
  const int levels = five_bits ? 31 : 15;
  float d, m = 0.0f;
  if (has_min) {
    m = *std::min_element(x, x + 32);
    d = (*std::max_element(x, x + 32) - m) / static_cast<float>(levels);
  } else {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        max = x[i];
      }
    }
    d = max / -static_cast<float>((levels + 1) / 2);
  }
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  // Stored: (x - m) / d, offset by 8 or 16 without a minimum, rounded as ggml does (adding 0.5
  // and truncating).
  const float zero = has_min ? 0.5f : static_cast<float>((levels + 1) / 2) + 0.5f;
  const std::uint16_t d_bits = f32_to_f16(d), m_bits = f32_to_f16(m);
  std::memcpy(block, &d_bits, 2);
  if (has_min) std::memcpy(block + 2, &m_bits, 2);
  std::uint8_t* qh = block + (has_min ? 4 : 2);  // five_bits only
  std::uint8_t* qs = qh + (five_bits ? 4 : 0);
  std::uint32_t high_bits = 0;
  for (int i = 0; i < 16; ++i) {
    const int lo = std::min(levels, static_cast<int>((x[i] - m) * id + zero));
    const int hi = std::min(levels, static_cast<int>((x[16 + i] - m) * id + zero));
    qs[i] = static_cast<std::uint8_t>((lo & 0xF) | (hi & 0xF) << 4);
    high_bits |= static_cast<std::uint32_t>(lo >> 4) << i;
    high_bits |= static_cast<std::uint32_t>(hi >> 4) << (16 + i);
  }
  if (five_bits) std::memcpy(qh, &high_bits, 4);
}

}  // namespace

bool can_dequantize(TensorType type) {
  switch (type) {
    case TensorType::f32:
    case TensorType::f16:
    case TensorType::bf16:
    case TensorType::q8_0:
    case TensorType::q4_0:
    case TensorType::q4_1:
    case TensorType::q5_0:
    case TensorType::q5_1:
    case TensorType::q4_k:
    case TensorType::q5_k:
    case TensorType::q6_k:
    case TensorType::q2_k:
    case TensorType::q3_k:
    case TensorType::iq4_nl:
    case TensorType::iq4_xs:
    case TensorType::mxfp4:
      return true;
    default:
      return false;
  }
}

std::size_t row_bytes(TensorType type, std::int64_t cols) {
  const auto traits = tensor_type_traits(static_cast<std::uint32_t>(type));
  if (!traits) return 0;
  return static_cast<std::size_t>(cols) / traits->block_elements * traits->block_bytes;
}

Result<void> dequantize_row(TensorType type, const void* data, std::int64_t cols, float* out) {
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  switch (type) {
    case TensorType::f32:
      std::memcpy(out, data, static_cast<std::size_t>(cols) * sizeof(float));
      return {};
    case TensorType::f16:
      for (std::int64_t i = 0; i < cols; ++i) out[i] = f16_to_f32(load_u16(bytes + 2 * i));
      return {};
    case TensorType::bf16:
      for (std::int64_t i = 0; i < cols; ++i) out[i] = bf16_to_f32(load_u16(bytes + 2 * i));
      return {};
    case TensorType::q8_0:
      for (std::int64_t b = 0; b < cols / 32; ++b) {
        const std::uint8_t* block = bytes + b * 34;
        const float d = f16_to_f32(load_u16(block));
        for (int i = 0; i < 32; ++i) out[b * 32 + i] = d * static_cast<std::int8_t>(block[2 + i]);
      }
      return {};
    case TensorType::q4_0:
      for (std::int64_t b = 0; b < cols / 32; ++b) {
        const std::uint8_t* block = bytes + b * 18;
        const float d = f16_to_f32(load_u16(block));
        for (int i = 0; i < 16; ++i) {
          out[b * 32 + i] = d * ((block[2 + i] & 0xF) - 8);
          out[b * 32 + 16 + i] = d * ((block[2 + i] >> 4) - 8);
        }
      }
      return {};
    case TensorType::q4_1:
      for (std::int64_t b = 0; b < cols / 32; ++b) {
        const std::uint8_t* block = bytes + b * 20;
        const float d = f16_to_f32(load_u16(block));
        const float m = f16_to_f32(load_u16(block + 2));
        for (int i = 0; i < 16; ++i) {
          out[b * 32 + i] = d * (block[4 + i] & 0xF) + m;
          out[b * 32 + 16 + i] = d * (block[4 + i] >> 4) + m;
        }
      }
      return {};
    case TensorType::q5_0:
    case TensorType::q5_1: {
      // d (f16), [m (f16) for Q5_1], 32 high bits, 16 bytes of low nibbles.
      const bool has_min = type == TensorType::q5_1;
      const std::size_t block_bytes = has_min ? 24 : 22;
      for (std::int64_t b = 0; b < cols / 32; ++b) {
        const std::uint8_t* block = bytes + b * block_bytes;
        const float d = f16_to_f32(load_u16(block));
        const float m = has_min ? f16_to_f32(load_u16(block + 2)) : 0.0f;
        std::uint32_t qh;
        std::memcpy(&qh, block + (has_min ? 4 : 2), 4);
        const std::uint8_t* qs = block + (has_min ? 8 : 6);
        const int offset = has_min ? 0 : 16;
        for (int i = 0; i < 16; ++i) {
          const int lo = (qs[i] & 0xF) | static_cast<int>(((qh >> i) & 1u) << 4);
          const int hi = (qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
          out[b * 32 + i] = d * (lo - offset) + m;
          out[b * 32 + 16 + i] = d * (hi - offset) + m;
        }
      }
      return {};
    }
    case TensorType::q5_k:
      for (std::int64_t b = 0; b < cols / 256; ++b) dequantize_q5_k(bytes + b * 176, out + b * 256);
      return {};
    case TensorType::q4_k:
      for (std::int64_t b = 0; b < cols / 256; ++b) dequantize_q4_k(bytes + b * 144, out + b * 256);
      return {};
    case TensorType::q6_k:
      for (std::int64_t b = 0; b < cols / 256; ++b) dequantize_q6_k(bytes + b * 210, out + b * 256);
      return {};
    case TensorType::q2_k:
      for (std::int64_t b = 0; b < cols / 256; ++b) dequantize_q2_k(bytes + b * 84, out + b * 256);
      return {};
    case TensorType::q3_k:
      for (std::int64_t b = 0; b < cols / 256; ++b) dequantize_q3_k(bytes + b * 110, out + b * 256);
      return {};
    case TensorType::iq4_nl:
      for (std::int64_t b = 0; b < cols / 32; ++b) {
        const std::uint8_t* block = bytes + b * 18;
        dequantize_nibbles_by_table(block + 2, f16_to_f32(load_u16(block)), kIq4NlValues,
                                    out + b * 32);
      }
      return {};
    case TensorType::iq4_xs:
      for (std::int64_t b = 0; b < cols / 256; ++b) {
        dequantize_iq4_xs(bytes + b * 136, out + b * 256);
      }
      return {};
    case TensorType::mxfp4:
      for (std::int64_t b = 0; b < cols / 32; ++b) {
        const std::uint8_t* block = bytes + b * 17;
        dequantize_nibbles_by_table(block + 1, e8m0_half_to_f32(block[0]), kMxfp4Values,
                                    out + b * 32);
      }
      return {};
    default:
      return make_error(ErrorCode::unsupported,
                        "cannot decode tensor type " + std::string(tensor_type_name(type)));
  }
}

Result<std::vector<std::byte>> quantize(TensorType type, std::span<const float> values,
                                        std::int64_t cols) {
  const auto traits = tensor_type_traits(static_cast<std::uint32_t>(type));
  if (!traits || cols <= 0 || values.size() % static_cast<std::size_t>(cols) != 0 ||
      cols % static_cast<std::int64_t>(traits->block_elements) != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "cannot quantize " + std::to_string(values.size()) + " values in rows of " +
                          std::to_string(cols));
  }
  std::vector<std::byte> out(values.size() / traits->block_elements * traits->block_bytes);
  auto* o = reinterpret_cast<std::uint8_t*>(out.data());
  auto put16 = [](std::uint8_t* p, std::uint16_t v) { std::memcpy(p, &v, 2); };
  switch (type) {
    case TensorType::f32:
      std::memcpy(o, values.data(), values.size_bytes());
      return out;
    case TensorType::f16:
      for (std::size_t i = 0; i < values.size(); ++i) put16(o + 2 * i, f32_to_f16(values[i]));
      return out;
    case TensorType::bf16:
      for (std::size_t i = 0; i < values.size(); ++i) put16(o + 2 * i, f32_to_bf16(values[i]));
      return out;
    case TensorType::q8_0:
      for (std::size_t b = 0; b < values.size() / 32; ++b) {
        const float* x = values.data() + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        std::uint8_t* block = o + b * 34;
        put16(block, f32_to_f16(d));
        for (int i = 0; i < 32; ++i) {
          block[2 + i] =
              static_cast<std::uint8_t>(static_cast<std::int8_t>(std::roundf(x[i] * id)));
        }
      }
      return out;
    case TensorType::q4_0:
    case TensorType::q4_1:
    case TensorType::q5_0:
    case TensorType::q5_1:
      for (std::size_t b = 0; b < values.size() / 32; ++b) {
        quantize_block32(values.data() + 32 * b, type, o + b * traits->block_bytes);
      }
      return out;
    case TensorType::q4_k:
    case TensorType::q5_k:
      for (std::size_t b = 0; b < values.size() / 256; ++b) {
        quantize_k_super_block(values.data() + 256 * b, type == TensorType::q4_k ? 15 : 31,
                               o + b * traits->block_bytes);
      }
      return out;
    case TensorType::q6_k:
      for (std::size_t b = 0; b < values.size() / 256; ++b) {
        quantize_q6_k_super_block(values.data() + 256 * b, o + b * traits->block_bytes);
      }
      return out;
    case TensorType::q2_k:
    case TensorType::q3_k:
    case TensorType::iq4_nl:
    case TensorType::iq4_xs:
    case TensorType::mxfp4: {
      const auto encode = type == TensorType::q2_k     ? quantize_q2_k_block
                          : type == TensorType::q3_k   ? quantize_q3_k_block
                          : type == TensorType::iq4_nl ? quantize_iq4_nl_block
                          : type == TensorType::iq4_xs ? quantize_iq4_xs_block
                                                       : quantize_mxfp4_block;
      const std::size_t n = traits->block_elements;
      for (std::size_t b = 0; b < values.size() / n; ++b) {
        encode(values.data() + n * b, o + b * traits->block_bytes);
      }
      return out;
    }
    default:
      return make_error(ErrorCode::unsupported,
                        "cannot encode tensor type " + std::string(tensor_type_name(type)));
  }
}

}  // namespace troupe::gguf
