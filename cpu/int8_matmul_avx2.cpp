// The int8 matmul on AVX2, with AVX-VNNI's vpdpbusd where TROUPE_INT8_AVX_VNNI is defined
// (int8_matmul_avx_vnni.cpp) and pmaddubsw + pmaddwd otherwise. Built with -mavx2 -mfma
// (and -mavxvnni); run only where the processor has them (int8_matmul.cpp checks).
#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "cpu/int8_matmul.hpp"
#include "gguf/half.hpp"

#ifdef TROUPE_INT8_AVX_VNNI
#define TROUPE_INT8_NAMESPACE int8_avx_vnni
#else
#define TROUPE_INT8_NAMESPACE int8_avx2
#endif

namespace troupe::cpu::TROUPE_INT8_NAMESPACE {

#include "cpu/int8_bytes256.hpp"  // NOLINT(bugprone-suspicious-include): a copy per file

// 64 bytes or 16 floats as two 256-bit halves.
struct Ops {
  struct Unit {
    __m256i lo, hi;
  };
  struct Acc {
    __m256 lo, hi;
  };
#ifdef TROUPE_INT8_AVX_VNNI
  static constexpr bool kWideUnsignedBytes = true;  // vpdpbusd sums byte products in int32
#else
  static constexpr bool kWideUnsignedBytes = false;  // pmaddubsw saturates its pair sums
#endif

  static Acc zero() {
    return {_mm256_setzero_ps(), _mm256_setzero_ps()};
  }
  static Acc load(const float* p) {
    return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
  }
  static Acc mul(Acc a, Acc b) {
    return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)};
  }
  static Acc fma(Acc a, Acc b, Acc c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static float sum(Acc a) {
    const __m256 s = _mm256_add_ps(a.lo, a.hi);
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
  }
  static Acc lanes8(float s0, float s1) {
    return {_mm256_set1_ps(s0), _mm256_set1_ps(s1)};
  }
  static Acc set1(float f) {
    return {_mm256_set1_ps(f), _mm256_set1_ps(f)};
  }
  static float half(std::uint16_t bits) {
    return _cvtsh_ss(bits);
  }
  static Acc halves8(std::uint16_t h0, std::uint16_t h1, std::uint16_t h2, std::uint16_t h3,
                     std::uint16_t h4, std::uint16_t h5, std::uint16_t h6, std::uint16_t h7) {
    return {Bytes256::halves(h0, h1, h2, h3, h4, h5, h6, h7), _mm256_setzero_ps()};
  }
  static Acc e8m0_halves8(std::uint64_t exponents) {
    return {Bytes256::e8m0_halves(exponents), _mm256_setzero_ps()};
  }
  static __m256 widen_u8(std::uint32_t w0, std::uint32_t w1) {
    const auto pair = static_cast<long long>(w0 | (static_cast<std::uint64_t>(w1) << 32));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(pair)));
  }
  static Acc words_u8(std::uint32_t w0, std::uint32_t w1, std::uint32_t w2, std::uint32_t w3) {
    return {widen_u8(w0, w1), widen_u8(w2, w3)};
  }
  static __m256 widen_i8(const std::int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static Acc bytes_i8(const std::int8_t* p) {
    return {widen_i8(p), widen_i8(p + 8)};
  }
  static __m256 pick(__m256 v, int i0, int i1, int i2, int i3, int i4, int i5, int i6, int i7) {
    return _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(i0, i1, i2, i3, i4, i5, i6, i7));
  }
  static Acc spread8(Acc s, int k) {
    return {_mm256_permutevar8x32_ps(s.lo, _mm256_set1_epi32(2 * k)),
            _mm256_permutevar8x32_ps(s.lo, _mm256_set1_epi32(2 * k + 1))};
  }
  static Acc spread4(Acc s, int k) {
    const __m256 from = k < 2 ? s.lo : s.hi;
    const int b = (4 * k) % 8;
    return {pick(from, b, b, b, b, b + 1, b + 1, b + 1, b + 1),
            pick(from, b + 2, b + 2, b + 2, b + 2, b + 3, b + 3, b + 3, b + 3)};
  }
  static Acc pairs(__m256 v) {
    return {pick(v, 0, 0, 1, 1, 2, 2, 3, 3), pick(v, 4, 4, 5, 5, 6, 6, 7, 7)};
  }
  static Acc pairs_low(Acc s) {
    return pairs(s.lo);
  }
  static Acc pairs_high(Acc s) {
    return pairs(s.hi);
  }
  static Unit load_x(const std::int8_t* q) {
    return {Bytes256::load(reinterpret_cast<const std::uint8_t*>(q)),
            Bytes256::load(reinterpret_cast<const std::uint8_t*>(q) + 32)};
  }
  static Unit bytes2x32(const std::uint8_t* p0, const std::uint8_t* p1) {
    return {Bytes256::load(p0), Bytes256::load(p1)};
  }
  static Unit nibbles32(const std::uint8_t* p) {
    const __m256i b = Bytes256::load(p);
    return {Bytes256::low_nibbles(b), Bytes256::high_nibbles(b)};
  }
  static __m256i nibbles16(const std::uint8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), mask), _mm_and_si128(b, mask));
  }
  static Unit nibbles16x2(const std::uint8_t* p0, const std::uint8_t* p1) {
    return {nibbles16(p0), nibbles16(p1)};
  }
  static Unit crumbs32(const std::uint8_t* p, int shift) {
    const __m256i b = Bytes256::load(p);
    return {Bytes256::crumbs(b, shift), Bytes256::crumbs(b, shift + 2)};
  }
  static Unit lookup16(Unit idx, const std::uint8_t* table) {
    return {Bytes256::lookup16(idx.lo, table), Bytes256::lookup16(idx.hi, table)};
  }
  template <int kValue>
  static Unit with_high_bits(Unit u, const std::uint8_t* qh, int bit) {
    const __m256i h = Bytes256::load(qh);
    return {_mm256_or_si256(u.lo, Bytes256::bit_to<kValue>(h, bit)),
            _mm256_or_si256(u.hi, Bytes256::bit_to<kValue>(h, bit + 1))};
  }
  // 16 in byte i where bit i of `bits` is set, else 0: each byte picks its word's byte
  // i / 8, keeps bit i % 8 and compares.
  static __m256i word_bits_to_16(std::uint32_t bits) {
    const __m256i spread =
        _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                            _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                               0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(16));
  }
  static Unit high_bits_2x32(Unit u, std::uint32_t qh0, std::uint32_t qh1) {
    return {_mm256_or_si256(u.lo, word_bits_to_16(qh0)),
            _mm256_or_si256(u.hi, word_bits_to_16(qh1))};
  }
  static Unit q6(const std::uint8_t* ql, const std::uint8_t* qh, bool high, int shift) {
    const __m256i h = Bytes256::load(qh);
    return {Bytes256::q6_quarter(ql, h, high, shift),
            Bytes256::q6_quarter(ql + 32, h, high, shift + 2)};
  }
  // Per lane of 4: the sum of u[i] * q[i]. pmaddubsw's int16 pair sums cannot saturate here:
  // u <= 63 (K-quants, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4's 24) or |w| <= 128 with |q| <= 127
  // (Q8_0, and IQ4's signed levels on this path) keeps them within 32512. With VNNI any u is
  // exact (IQ4's levels + 128).
  static __m256i idot(__m256i u, __m256i q) {
#ifdef TROUPE_INT8_AVX_VNNI
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, q);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
#endif
  }
  static Acc dot_fma(Acc acc, Unit u, Unit q, Acc scale) {
    return {_mm256_fmadd_ps(_mm256_cvtepi32_ps(idot(u.lo, q.lo)), scale.lo, acc.lo),
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(idot(u.hi, q.hi)), scale.hi, acc.hi)};
  }
  static Acc dot_fma_signed(Acc acc, Unit w, Unit q, Acc scale) {
    const Unit u{_mm256_sign_epi8(w.lo, w.lo), _mm256_sign_epi8(w.hi, w.hi)};
    const Unit signed_q{_mm256_sign_epi8(q.lo, w.lo), _mm256_sign_epi8(q.hi, w.hi)};
    return dot_fma(acc, u, signed_q, scale);
  }
};

}  // namespace troupe::cpu::TROUPE_INT8_NAMESPACE
#include "cpu/int8_matmul_impl.hpp"
