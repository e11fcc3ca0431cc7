// The repacked int8 kernel (int8_repacked_impl.hpp) on AVX2: 16 rows in two 256-bit halves
// (rows 0-7, 8-15), tiles of up to 2 activation rows (16 registers). With AVX-VNNI
// (int8_repacked_avx_vnni.cpp defines TROUPE_REPACK_AVX_VNNI) the byte products sum by
// vpdpbusd; otherwise by pmaddubsw + pmaddwd, whose 16-bit pair sums are exact only while
// u <= 63 (2 * 63 * 128 < 2^15): there Q8_0, IQ4_NL and IQ4_XS keep the file's layout
// (int8_repack.cpp). Built with -mavx2 -mfma -mf16c (and -mavxvnni); run only where the
// processor has them.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/int8_repack.hpp"

#ifdef TROUPE_REPACK_AVX_VNNI
#define TROUPE_REPACK_NAMESPACE int8_avx_vnni
#else
#define TROUPE_REPACK_NAMESPACE int8_avx2
#endif

namespace troupe::cpu::TROUPE_REPACK_NAMESPACE {

struct Ops {
  struct V {
    __m256i lo, hi;
  };
  struct F {
    __m256 lo, hi;
  };
  static constexpr int kMaxNT = 2;  // 4 int and 4 float accumulators of 16 registers

  static V zero_i() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  static F zero_f() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static V load(const std::uint8_t* p) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))};
  }
  static V bytes(char c) {
    const __m256i v = _mm256_set1_epi8(c);
    return {v, v};
  }
  static V set1_32(std::int32_t i) {
    const __m256i v = _mm256_set1_epi32(i);
    return {v, v};
  }
  static F set1(float f) {
    const __m256 v = _mm256_set1_ps(f);
    return {v, v};
  }
  static V four(const std::int8_t* p) {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return set1_32(v);
  }
  static __m256i dot256(__m256i acc, __m256i u, __m256i x) {
#ifdef TROUPE_REPACK_AVX_VNNI
    return _mm256_dpbusd_avx_epi32(acc, u, x);
#else
    const __m256i pairs = _mm256_maddubs_epi16(u, x);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
  }
  static V dot(V acc, V u, V x) {
    return {dot256(acc.lo, u.lo, x.lo), dot256(acc.hi, u.hi, x.hi)};
  }
  static V and_(V a, V b) {
    return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)};
  }
  static V or_(V a, V b) {
    return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)};
  }
  static V shr(V a, int n) {
    return {_mm256_srli_epi16(a.lo, n), _mm256_srli_epi16(a.hi, n)};
  }
  static V shl(V a, int n) {
    return {_mm256_slli_epi16(a.lo, n), _mm256_slli_epi16(a.hi, n)};
  }
  static V bit_to_4(V h, int bit) {
    if (bit < 4) {
      const __m128i n = _mm_cvtsi32_si128(4 - bit);
      return {_mm256_sll_epi16(h.lo, n), _mm256_sll_epi16(h.hi, n)};
    }
    const __m128i n = _mm_cvtsi32_si128(bit - 4);
    return {_mm256_srl_epi16(h.lo, n), _mm256_srl_epi16(h.hi, n)};
  }
  static V shuffle(V table, V idx) {
    return {_mm256_shuffle_epi8(table.lo, idx.lo), _mm256_shuffle_epi8(table.hi, idx.hi)};
  }
  static V iq4_table() {
    alignas(16) std::uint8_t b[16];
    for (int i = 0; i < 16; ++i) b[i] = static_cast<std::uint8_t>(gguf::kIq4NlValues[i] + 128);
    const __m256i t =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(b)));
    return {t, t};
  }
  // MXFP4's doubled FP4 levels + 12.
  static V mxfp4_table() {
    alignas(16) std::uint8_t b[16];
    for (int i = 0; i < 16; ++i) b[i] = static_cast<std::uint8_t>(gguf::kMxfp4Values[i] + 12);
    const __m256i t =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(b)));
    return {t, t};
  }
  static F cvt(V a) {
    return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)};
  }
  static F nibbles16_lo(const std::uint8_t* p) {
    const __m256i m = _mm256_set1_epi32(15);
    return {
        _mm256_cvtepi32_ps(_mm256_and_si256(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), m)),
        _mm256_cvtepi32_ps(_mm256_and_si256(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))), m))};
  }
  static F nibbles16_hi(const std::uint8_t* p) {
    return {
        _mm256_cvtepi32_ps(_mm256_srli_epi32(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 4)),
        _mm256_cvtepi32_ps(_mm256_srli_epi32(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))), 4))};
  }
  static F floats16(const std::uint8_t* p) {
    return {_mm256_loadu_ps(reinterpret_cast<const float*>(p)),
            _mm256_loadu_ps(reinterpret_cast<const float*>(p + 32))};
  }
  static F mul(F a, F b) {
    return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
  }
  static F fma(F a, F b, F c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static F neg(F a) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return {_mm256_xor_ps(a.lo, sign), _mm256_xor_ps(a.hi, sign)};
  }
  static F halves16(const std::uint8_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
  static F bytes16_u(const std::uint8_t* p) {
    return {_mm256_cvtepi32_ps(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
            _mm256_cvtepi32_ps(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))))};
  }
  static F bytes16_i(const std::uint8_t* p) {
    return {_mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
            _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))))};
  }
  static void store(float* out, F v, int rows) {
    if (rows == 16) {
      _mm256_storeu_ps(out, v.lo);
      _mm256_storeu_ps(out + 8, v.hi);
      return;
    }
    // Lane i is stored where i < rows (the group's real rows).
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i n = _mm256_set1_epi32(rows);
    _mm256_maskstore_ps(out, _mm256_cmpgt_epi32(n, lanes), v.lo);
    _mm256_maskstore_ps(out + 8,
                        _mm256_cmpgt_epi32(_mm256_sub_epi32(n, _mm256_set1_epi32(8)), lanes), v.hi);
  }
};

}  // namespace troupe::cpu::TROUPE_REPACK_NAMESPACE

#include "cpu/int8_repacked_impl.hpp"
