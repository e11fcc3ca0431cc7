// Scalar conversions between float32 and the 16-bit float formats (F16, BF16), and MXFP4's
// E8M0 scales.
// The SIMD kernels in cpu/ have their own; these serve loaders, tests and references.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace troupe::gguf {

inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf or nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round to nearest even, as the F16C instruction does.
inline std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow
  if (abs < 0x38800000u) {                                  // subnormal half or zero
    const float magic = std::bit_cast<float>(0x3f000000u);  // 0.5: shifts into place
    const float v = std::bit_cast<float>(abs) + magic;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(v) - 0x3f000000u));
  }
  const std::uint32_t mantissa_odd = (abs >> 13) & 1u;
  std::uint32_t rounded = abs + 0xc8000fffu + mantissa_odd;  // rebias and round
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

// As f32_to_f16, but a value beyond F16's range (infinities too) becomes the largest
// finite half of its sign, 65504, where f32_to_f16 gives an infinity; NaN stays NaN. What a
// KV cache stores: an infinite key would turn its whole attention row into NaN.
inline std::uint16_t f32_to_f16_saturated(float f) {
  if (f != f) return f32_to_f16(f);
  return f32_to_f16(std::clamp(f, -65504.0f, 65504.0f));
}

// Half of an E8M0 scale (MXFP4's shared exponent e: 2^(e - 127)), so 2^(e - 128): MXFP4's
// values are stored doubled (kMxfp4Values). e 0 and 1 give the subnormals 2^-128 and 2^-127;
// 255 gives 2^127 (ggml does not treat it as NaN either).
inline float e8m0_half_to_f32(std::uint8_t e) {
  const std::uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<std::uint32_t>(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

inline float bf16_to_f32(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 64u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

}  // namespace troupe::gguf
