#include "gguf/quantize_ref.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "gguf/half.hpp"
#include "gguf/tensor_type.hpp"

// Every search below takes ggml's float operations in ggml's order (sums accumulated
// element by element, products grouped left to right), so that its choices, ties included,
// and therefore its bytes are ggml's.

namespace troupe::gguf {

namespace {

// ggml's threshold below which a group counts as all zero.
constexpr float kZeroGroup = 1e-15f;

// Round to nearest, ties to even, as ggml's nearest_int: adding 1.5 * 2^23 leaves the rounded
// value in the low mantissa bits (|v| < 2^22).
int round_nearest(float v) {
  const float shifted = v + 12582912.0f;
  return static_cast<int>(std::bit_cast<std::uint32_t>(shifted) & 0x7fffffu) - 0x400000;
}

void put_f16(std::uint8_t* p, float value) {
  const std::uint16_t bits = f32_to_f16(value);
  std::memcpy(p, &bits, 2);
}

float get_f16(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(bits);
}

// Q2_K and Q3_K store 2-bit values as ggml does: in each half of 128 values, value 32j + l
// (l < 32) in bits 2j, 2j+1 of byte l of that half's 32 bytes.
void pack_2_bits(const std::uint8_t* q, std::uint8_t* qs) {
  for (int half = 0; half < 2; ++half) {
    const std::uint8_t* v = q + 128 * half;
    for (int l = 0; l < 32; ++l) {
      qs[32 * half + l] =
          static_cast<std::uint8_t>(v[l] | v[l + 32] << 2 | v[l + 64] << 4 | v[l + 96] << 6);
    }
  }
}

// ggml's make_qkx2_quants with absolute errors (Q2_K's use): values q in [0, nmax] with
// x ~ scale * q - min, min >= 0 returned through `min_out`. Starts from the range mapped onto
// nmax steps, then tries nstep + 1 step counts nmax + rmin + rdelta * i, each fitted by
// weighted least squares, and keeps the one of least weighted absolute error.
float fit_scale_and_min(int n, int nmax, const float* x, const float* weights, std::uint8_t* q,
                        float& min_out, std::uint8_t* trial, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill_n(q, n, std::uint8_t{0});
    min_out = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    q[i] = static_cast<std::uint8_t>(std::clamp(round_nearest(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * static_cast<float>(q[i]) + min - x[i];
    best_error += weights[i] * std::fabs(diff);
  }
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(round_nearest(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<std::uint8_t>(l);
      const float w = weights[i];
      const auto lf = static_cast<float>(l);
      sum_l += w * lf;
      sum_l2 += w * lf * lf;
      sum_xl += w * lf * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * static_cast<float>(trial[i]) + this_min - x[i];
        error += weights[i] * std::fabs(diff);
      }
      if (error < best_error) {
        std::copy_n(trial, n, q);
        best_error = error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  min_out = -min;
  return scale;
}

// ggml's make_q3_quants with its refinement (Q3_K's use): signed values in [-nmax, nmax - 1]
// for x ~ scale * q, stored + nmax. From the largest magnitude mapped onto -nmax, each value
// in turn moves to its best level for the others' least-squares scale while that lowers the
// error weighted by x^2, for up to 5 rounds.
float fit_symmetric_scale(int n, int nmax, const float* x, std::int8_t* q) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kZeroGroup) {
    std::fill_n(q, n, std::int8_t{0});
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sum_lx = 0, sum_l2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(round_nearest(iscale * x[i]), -nmax, nmax - 1);
    q[i] = static_cast<std::int8_t>(l);
    const float w = x[i] * x[i];
    sum_lx += w * x[i] * static_cast<float>(l);
    sum_l2 += w * static_cast<float>(l) * static_cast<float>(l);
  }
  for (int round = 0; round < 5; ++round) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const auto old_l = static_cast<float>(q[i]);
      float slx = sum_lx - w * x[i] * old_l;
      if (!(slx > 0)) continue;  // as ggml's `if (slx > 0)`, NaN included
      float sl2 = sum_l2 - w * old_l * old_l;
      const int l = std::clamp(round_nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (l == q[i]) continue;
      const auto lf = static_cast<float>(l);
      slx += w * x[i] * lf;
      sl2 += w * lf * lf;
      if (sl2 > 0 && slx * slx * sum_l2 > sum_lx * sum_lx * sl2) {
        q[i] = static_cast<std::int8_t>(l);
        sum_lx = slx;
        sum_l2 = sl2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) q[i] = static_cast<std::int8_t>(q[i] + nmax);
  return sum_l2 > 0.0f ? sum_lx / sum_l2 : 0.0f;
}

// The index of the level of kIq4NlValues (ascending) nearest to x; a tie goes up.
int nearest_iq4_level(float x) {
  const std::int8_t* v = kIq4NlValues;
  if (x <= static_cast<float>(v[0])) return 0;
  if (x >= static_cast<float>(v[15])) return 15;
  int low = 0, high = 15;
  while (high - low > 1) {
    const int mid = (low + high) / 2;
    if (x < static_cast<float>(v[mid])) {
      high = mid;
    } else {
      low = mid;
    }
  }
  return x - static_cast<float>(v[high - 1]) < static_cast<float>(v[high]) - x ? high - 1 : high;
}

// One IQ4 block of 32: the largest magnitude on the outermost level (-127 for the reference's
// first guess), then the least-squares scale for those levels weighted by x^2; with `trials`,
// also the 2 * trials + 1 first guesses (trial - 127) / max, the best fit kept. Returns the
// scale; the levels chosen for the first guess are left in q.
float fit_iq4_block(const float* x, int trials, std::uint8_t* q) {
  float weight[32];
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    weight[j] = x[j] * x[j];
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  if (amax < kZeroGroup) {
    // ggml leaves these indices as they were; they decode to zero whatever they are.
    std::fill_n(q, 32, std::uint8_t{0});
    return 0.0f;
  }
  const auto first = static_cast<float>(kIq4NlValues[0]);
  float d = trials > 0 ? -max / first : max / first;
  float id = 1 / d;
  float sum_qx = 0, sum_q2 = 0;
  for (int j = 0; j < 32; ++j) {
    const int l = nearest_iq4_level(id * x[j]);
    q[j] = static_cast<std::uint8_t>(l);
    const auto level = static_cast<float>(kIq4NlValues[l]);
    sum_qx += weight[j] * level * x[j];
    sum_q2 += weight[j] * level * level;
  }
  d = sum_q2 > 0 ? sum_qx / sum_q2 : 0.0f;
  float best = d * sum_qx;
  for (int trial = -trials; trial <= trials; ++trial) {
    id = static_cast<float>(trial + kIq4NlValues[0]) / max;
    sum_qx = sum_q2 = 0;
    for (int j = 0; j < 32; ++j) {
      const auto level = static_cast<float>(kIq4NlValues[nearest_iq4_level(id * x[j])]);
      sum_qx += weight[j] * level * x[j];
      sum_q2 += weight[j] * level * level;
    }
    if (sum_q2 > 0 && sum_qx * sum_qx > best * sum_q2) {
      d = sum_qx / sum_q2;
      best = d * sum_qx;
    }
  }
  return d;
}

// IQ4_NL and IQ4_XS nibbles: value i of a block of 32 in the low nibble of byte i (i < 16),
// value i + 16 in its high nibble.
void pack_nibbles(const std::uint8_t* q, std::uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<std::uint8_t>(q[j] | q[16 + j] << 4);
}

// The index of the MXFP4 level nearest to x at scale d; a tie goes to the lower index.
int nearest_mxfp4_level(float x, float d) {
  int best = 0;
  float best_error = std::fabs(static_cast<float>(kMxfp4Values[0]) * d - x);
  for (int i = 1; i < 16; ++i) {
    const float error = std::fabs(static_cast<float>(kMxfp4Values[i]) * d - x);
    if (error < best_error) {
      best = i;
      best_error = error;
    }
  }
  return best;
}

}  // namespace

// Q2_K: per group of 16, a scale and minimum fitted (absolute errors weighted by |x|); both
// sets quantized to 4 bits of the largest, over d and dmin; then the values again, for the
// scales as stored.
void quantize_q2_k_block(const float* x, std::uint8_t* block) {
  std::uint8_t* scales = block;   // [16]: scale | minimum << 4
  std::uint8_t* qs = block + 16;  // [64]
  std::uint8_t* d_field = block + 80;
  std::uint8_t* dmin_field = block + 82;
  std::uint8_t q[256], trial[16];
  float weights[16], group_scale[16], group_min[16];
  constexpr float kLevels = 15.0f;
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    group_scale[j] = fit_scale_and_min(16, 3, x + 16 * j, weights, q + 16 * j, group_min[j], trial,
                                       -0.5f, 0.1f, 15);
    max_scale = std::max(max_scale, group_scale[j]);
    max_min = std::max(max_min, group_min[j]);
  }
  if (max_scale > 0) {
    const float iscale = kLevels / max_scale;
    for (int j = 0; j < 16; ++j) {
      scales[j] = static_cast<std::uint8_t>(round_nearest(iscale * group_scale[j]));
    }
    put_f16(d_field, max_scale / kLevels);
  } else {
    std::fill_n(scales, 16, std::uint8_t{0});
    put_f16(d_field, 0.0f);
  }
  if (max_min > 0) {
    const float iscale = kLevels / max_min;
    for (int j = 0; j < 16; ++j) {
      scales[j] = static_cast<std::uint8_t>(scales[j] | round_nearest(iscale * group_min[j]) << 4);
    }
    put_f16(dmin_field, max_min / kLevels);
  } else {
    put_f16(dmin_field, 0.0f);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = get_f16(d_field) * static_cast<float>(scales[j] & 0xF);
    if (d == 0.0f) continue;
    const float dm = get_f16(dmin_field) * static_cast<float>(scales[j] >> 4);
    for (int i = 0; i < 16; ++i) {
      q[16 * j + i] =
          static_cast<std::uint8_t>(std::clamp(round_nearest((x[16 * j + i] + dm) / d), 0, 3));
    }
  }
  pack_2_bits(q, qs);
}

// Q3_K: per group of 16 a signed scale (fit_symmetric_scale, levels -4..3); the scales
// quantized to 6 bits of the one of largest magnitude (which becomes -32) over d; then the
// values again for the scales as stored, their third bits in hmask.
void quantize_q3_k_block(const float* x, std::uint8_t* block) {
  std::uint8_t* hmask = block;          // [32]
  std::uint8_t* qs = block + 32;        // [64]
  std::uint8_t* packed = block + 96;    // [12]
  std::uint8_t* d_field = block + 108;  // f16
  std::int8_t q[256];
  float group_scale[16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < 16; ++j) {
    group_scale[j] = fit_symmetric_scale(16, 4, x + 16 * j, q + 16 * j);
    const float magnitude = std::fabs(group_scale[j]);
    if (magnitude > amax) {
      amax = magnitude;
      max_scale = group_scale[j];
    }
  }
  std::fill_n(packed, 12, std::uint8_t{0});
  if (max_scale != 0.0f) {
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < 16; ++j) {
      // ggml keeps the rounded scale in an int8 before clamping it.
      const auto rounded = static_cast<std::int8_t>(round_nearest(iscale * group_scale[j]));
      const int l = std::clamp<int>(rounded, -32, 31) + 32;
      if (j < 8) {
        packed[j] = static_cast<std::uint8_t>(l & 0xF);
      } else {
        packed[j - 8] = static_cast<std::uint8_t>(packed[j - 8] | (l & 0xF) << 4);
      }
      packed[8 + j % 4] = static_cast<std::uint8_t>(packed[8 + j % 4] | (l >> 4) << (2 * (j / 4)));
    }
    put_f16(d_field, 1 / iscale);
  } else {
    put_f16(d_field, 0.0f);
  }
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
    const int scale = (low | ((packed[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
    const float d = get_f16(d_field) * static_cast<float>(scale);
    if (d == 0.0f) continue;
    for (int i = 0; i < 16; ++i) {
      q[16 * j + i] =
          static_cast<std::int8_t>(std::clamp(round_nearest(x[16 * j + i] / d), -4, 3) + 4);
    }
  }
  // Value i's third bit: bit i / 32 of hmask byte i % 32; the low two bits stay in q.
  std::fill_n(hmask, 32, std::uint8_t{0});
  std::uint8_t low[256];
  for (int i = 0; i < 256; ++i) {
    const bool high = q[i] > 3;
    if (high) hmask[i % 32] = static_cast<std::uint8_t>(hmask[i % 32] | 1 << (i / 32));
    low[i] = static_cast<std::uint8_t>(high ? q[i] - 4 : q[i]);
  }
  pack_2_bits(low, qs);
}

// IQ4_NL (ggml's reference: first guess only, no trials): the block's fitted scale as d.
void quantize_iq4_nl_block(const float* x, std::uint8_t* block) {
  std::uint8_t q[32];
  const float d = fit_iq4_block(x, -1, q);
  put_f16(block, d);
  pack_nibbles(q, block + 2);
}

// IQ4_XS: each block of 32 fitted with 7 trials either side; the scales quantized to 6 bits
// of the one of largest magnitude (which becomes -32) over d; each block's levels chosen
// again for its scale as stored.
void quantize_iq4_xs_block(const float* x, std::uint8_t* block) {
  std::uint8_t* scales_l = block + 4;  // [4]
  std::uint8_t* qs = block + 8;        // [128]
  float block_scale[8];
  std::uint8_t q[32];
  float max_scale = 0, amax_scale = 0;
  for (int b = 0; b < 8; ++b) {
    block_scale[b] = fit_iq4_block(x + 32 * b, 7, q);
    const float magnitude = std::fabs(block_scale[b]);
    if (magnitude > amax_scale) {
      amax_scale = magnitude;
      max_scale = block_scale[b];
    }
  }
  const float d = -max_scale / 32;
  put_f16(block, d);
  const float id = d != 0.0f ? 1 / d : 0.0f;
  std::uint16_t scales_h = 0;
  for (int b = 0; b < 8; ++b) {
    const int l = std::clamp(round_nearest(id * block_scale[b]), -32, 31);
    const float dl = d * static_cast<float>(l);
    const float idl = dl != 0.0f ? 1 / dl : 0.0f;
    for (int j = 0; j < 32; ++j)
      q[j] = static_cast<std::uint8_t>(nearest_iq4_level(idl * x[32 * b + j]));
    pack_nibbles(q, qs + 16 * b);
    const int stored = l + 32;
    if (b % 2 == 0) {
      scales_l[b / 2] = static_cast<std::uint8_t>(stored & 0xF);
    } else {
      scales_l[b / 2] = static_cast<std::uint8_t>(scales_l[b / 2] | (stored & 0xF) << 4);
    }
    scales_h = static_cast<std::uint16_t>(scales_h | (stored >> 4) << (2 * b));
  }
  std::memcpy(block + 2, &scales_h, 2);
}

// MXFP4: the shared exponent puts the largest magnitude in [4, 8) of the doubled levels'
// scale (so up to 6 of FP4's, with rounding); each value then takes its nearest level.
void quantize_mxfp4_block(const float* x, std::uint8_t* block) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  std::uint8_t e = 0;
  if (amax > 0) {
    // ggml converts this float straight to a byte; beyond [0, 255] (|x| under 2^-125, or
    // infinite) that is undefined, so it is clamped here.
    const float exponent = std::floor(std::log2(amax)) - 2 + 127;
    e = static_cast<std::uint8_t>(std::clamp(exponent, 0.0f, 255.0f));
  }
  block[0] = e;
  const float d = e8m0_half_to_f32(e);
  for (int j = 0; j < 16; ++j) {
    block[1 + j] = static_cast<std::uint8_t>(nearest_mxfp4_level(x[j], d) |
                                             nearest_mxfp4_level(x[16 + j], d) << 4);
  }
}

}  // namespace troupe::gguf
