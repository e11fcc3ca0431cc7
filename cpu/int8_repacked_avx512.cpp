// The repacked int8 kernel (int8_repacked_impl.hpp) on AVX-512 VNNI: 16 rows in one
// register, tiles of up to 8 activation rows. Built with the AVX-512 flags; run only where
// the processor has them (int8_repack.cpp checks).
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstring>

// GCC 12's AVX-512 headers build some results on `__m256d __Y = __Y;` (an intended
// undefined value), which -Werror=uninitialized rejects once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "cpu/int8_repack.hpp"

#define TROUPE_REPACK_NAMESPACE int8_avx512

namespace troupe::cpu::TROUPE_REPACK_NAMESPACE {

struct Ops {
  using V = __m512i;
  using F = __m512;
  static constexpr int kMaxNT = 8;  // 8 int and 8 float accumulators of 32 registers

  static V zero_i() { return _mm512_setzero_si512(); }
  static F zero_f() { return _mm512_setzero_ps(); }
  static V load(const std::uint8_t* p) { return _mm512_loadu_si512(p); }
  static V bytes(char c) { return _mm512_set1_epi8(c); }
  static V set1_32(std::int32_t i) { return _mm512_set1_epi32(i); }
  static F set1(float f) { return _mm512_set1_ps(f); }
  static V four(const std::int8_t* p) {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static V dot(V acc, V u, V x) { return _mm512_dpbusd_epi32(acc, u, x); }
  static V and_(V a, V b) { return _mm512_and_si512(a, b); }
  static V or_(V a, V b) { return _mm512_or_si512(a, b); }
  static V shr(V a, unsigned n) { return _mm512_srli_epi16(a, n); }
  static V shl(V a, unsigned n) { return _mm512_slli_epi16(a, n); }
  // Bit `bit` of every byte moved to bit 4 (the other bits are the caller's to mask off).
  static V bit_to_4(V h, int bit) {
    return bit < 4 ? _mm512_sll_epi16(h, _mm_cvtsi32_si128(4 - bit))
                   : _mm512_srl_epi16(h, _mm_cvtsi32_si128(bit - 4));
  }
  static V shuffle(V table, V idx) { return _mm512_shuffle_epi8(table, idx); }
  // IQ4's 16 levels + 128, in every 128-bit lane.
  static V iq4_table() {
    alignas(16) std::uint8_t b[16];
    for (int i = 0; i < 16; ++i) b[i] = static_cast<std::uint8_t>(gguf::kIq4NlValues[i] + 128);
    return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(b)));
  }
  // MXFP4's doubled FP4 levels + 12.
  static V mxfp4_table() {
    alignas(16) std::uint8_t b[16];
    for (int i = 0; i < 16; ++i) b[i] = static_cast<std::uint8_t>(gguf::kMxfp4Values[i] + 12);
    return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(b)));
  }
  static F cvt(V a) { return _mm512_cvtepi32_ps(a); }
  static F nibbles16_lo(const std::uint8_t* p) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
  }
  static F nibbles16_hi(const std::uint8_t* p) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
  }
  static F floats16(const std::uint8_t* p) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
  }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F neg(F a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
  static F halves16(const std::uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F bytes16_u(const std::uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F bytes16_i(const std::uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store(float* out, F v, int rows) {
    _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << rows) - 1), v);
  }
};

}  // namespace troupe::cpu::TROUPE_REPACK_NAMESPACE

#include "cpu/int8_repacked_impl.hpp"

namespace troupe::cpu::int8_avx512 {

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
