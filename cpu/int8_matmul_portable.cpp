// The int8 matmul in plain C++: the path every processor has, and the reference the
// vector paths are tested against (the same arithmetic, lane by lane).
#include <cstring>

#include "cpu/int8_matmul.hpp"
#include "gguf/half.hpp"

#define TROUPE_INT8_NAMESPACE int8_portable

namespace troupe::cpu::TROUPE_INT8_NAMESPACE {

struct Ops {
  struct Unit {
    std::uint8_t b[64];
  };
  struct Acc {
    float f[16];
  };
  static constexpr bool kWideUnsignedBytes = true;  // int32 arithmetic

  static Acc zero() { return Acc{}; }
  static Acc load(const float* p) {
    Acc a;
    std::memcpy(a.f, p, sizeof a.f);
    return a;
  }
  static Acc mul(Acc a, Acc b) {
    for (int i = 0; i < 16; ++i) a.f[i] *= b.f[i];
    return a;
  }
  static Acc fma(Acc a, Acc b, Acc c) {
    for (int i = 0; i < 16; ++i) c.f[i] += a.f[i] * b.f[i];
    return c;
  }
  static float sum(Acc a) {
    float s = 0.0f;
    for (float v : a.f) s += v;
    return s;
  }
  static Acc lanes8(float s0, float s1) {
    Acc a;
    for (int i = 0; i < 8; ++i) {
      a.f[i] = s0;
      a.f[8 + i] = s1;
    }
    return a;
  }
  static Acc set1(float f) {
    Acc a;
    for (float& v : a.f) v = f;
    return a;
  }
  static float half(std::uint16_t bits) { return gguf::f16_to_f32(bits); }
  static Acc halves8(std::uint16_t h0, std::uint16_t h1, std::uint16_t h2, std::uint16_t h3,
                     std::uint16_t h4, std::uint16_t h5, std::uint16_t h6, std::uint16_t h7) {
    const std::uint16_t h[8] = {h0, h1, h2, h3, h4, h5, h6, h7};
    Acc a{};
    for (int i = 0; i < 8; ++i) a.f[i] = gguf::f16_to_f32(h[i]);
    return a;
  }
  static Acc e8m0_halves8(std::uint64_t exponents) {
    Acc a{};
    for (int i = 0; i < 8; ++i) {
      a.f[i] = gguf::e8m0_half_to_f32(static_cast<std::uint8_t>(exponents >> (8 * i)));
    }
    return a;
  }
  static Acc words_u8(std::uint32_t w0, std::uint32_t w1, std::uint32_t w2, std::uint32_t w3) {
    const std::uint32_t w[4] = {w0, w1, w2, w3};
    Acc a;
    for (int i = 0; i < 16; ++i) a.f[i] = static_cast<float>((w[i / 4] >> (8 * (i % 4))) & 0xFF);
    return a;
  }
  static Acc bytes_i8(const std::int8_t* p) {
    Acc a;
    for (int i = 0; i < 16; ++i) a.f[i] = static_cast<float>(p[i]);
    return a;
  }
  static Acc spread8(Acc s, int k) { return lanes8(s.f[2 * k], s.f[2 * k + 1]); }
  static Acc spread4(Acc s, int k) {
    Acc a;
    for (int i = 0; i < 16; ++i) a.f[i] = s.f[4 * k + i / 4];
    return a;
  }
  static Acc pairs_low(Acc s) {
    Acc a;
    for (int i = 0; i < 16; ++i) a.f[i] = s.f[i / 2];
    return a;
  }
  static Acc pairs_high(Acc s) {
    Acc a;
    for (int i = 0; i < 16; ++i) a.f[i] = s.f[8 + i / 2];
    return a;
  }
  static Unit load_x(const std::int8_t* q) {
    Unit u;
    std::memcpy(u.b, q, 64);
    return u;
  }
  static Unit bytes2x32(const std::uint8_t* p0, const std::uint8_t* p1) {
    Unit u;
    std::memcpy(u.b, p0, 32);
    std::memcpy(u.b + 32, p1, 32);
    return u;
  }
  static Unit nibbles32(const std::uint8_t* p) {
    Unit u;
    for (int i = 0; i < 32; ++i) {
      u.b[i] = p[i] & 0xF;
      u.b[32 + i] = p[i] >> 4;
    }
    return u;
  }
  static Unit nibbles16x2(const std::uint8_t* p0, const std::uint8_t* p1) {
    Unit u;
    for (int i = 0; i < 16; ++i) {
      u.b[i] = p0[i] & 0xF;
      u.b[16 + i] = p0[i] >> 4;
      u.b[32 + i] = p1[i] & 0xF;
      u.b[48 + i] = p1[i] >> 4;
    }
    return u;
  }
  static Unit crumbs32(const std::uint8_t* p, int shift) {
    Unit u;
    for (int i = 0; i < 32; ++i) {
      u.b[i] = static_cast<std::uint8_t>((p[i] >> shift) & 3);
      u.b[32 + i] = static_cast<std::uint8_t>((p[i] >> (shift + 2)) & 3);
    }
    return u;
  }
  static Unit lookup16(Unit idx, const std::uint8_t* table) {
    for (std::uint8_t& b : idx.b) b = table[b];
    return idx;
  }
  template <int kValue>
  static Unit with_high_bits(Unit u, const std::uint8_t* qh, int bit) {
    for (int i = 0; i < 32; ++i) {
      u.b[i] = static_cast<std::uint8_t>(u.b[i] | ((qh[i] >> bit) & 1) * kValue);
      u.b[32 + i] = static_cast<std::uint8_t>(u.b[32 + i] | ((qh[i] >> (bit + 1)) & 1) * kValue);
    }
    return u;
  }
  static Unit high_bits_2x32(Unit u, std::uint32_t qh0, std::uint32_t qh1) {
    for (int i = 0; i < 32; ++i) {
      u.b[i] = static_cast<std::uint8_t>(u.b[i] | ((qh0 >> i) & 1u) << 4);
      u.b[32 + i] = static_cast<std::uint8_t>(u.b[32 + i] | ((qh1 >> i) & 1u) << 4);
    }
    return u;
  }
  static Unit q6(const std::uint8_t* ql, const std::uint8_t* qh, bool high, int shift) {
    Unit u;
    for (int i = 0; i < 32; ++i) {
      const int lo = high ? ql[i] >> 4 : ql[i] & 0xF;
      const int hi = high ? ql[32 + i] >> 4 : ql[32 + i] & 0xF;
      u.b[i] = static_cast<std::uint8_t>(lo | (((qh[i] >> shift) & 3) << 4));
      u.b[32 + i] = static_cast<std::uint8_t>(hi | (((qh[i] >> (shift + 2)) & 3) << 4));
    }
    return u;
  }
  template <bool kSignedWeights>
  static Acc dot_fma_any(Acc acc, Unit w, Unit q, Acc scale) {
    for (int lane = 0; lane < 16; ++lane) {
      std::int32_t dot = 0;
      for (int i = 4 * lane; i < 4 * lane + 4; ++i) {
        const int wv = kSignedWeights ? static_cast<std::int8_t>(w.b[i]) : w.b[i];
        dot += wv * static_cast<std::int8_t>(q.b[i]);
      }
      acc.f[lane] += static_cast<float>(dot) * scale.f[lane];
    }
    return acc;
  }
  static Acc dot_fma(Acc acc, Unit u, Unit q, Acc scale) {
    return dot_fma_any<false>(acc, u, q, scale);
  }
  static Acc dot_fma_signed(Acc acc, Unit w, Unit q, Acc scale) {
    return dot_fma_any<true>(acc, w, q, scale);
  }
};

}  // namespace troupe::cpu::TROUPE_INT8_NAMESPACE
#include "cpu/int8_matmul_impl.hpp"
