// The int8 matmul on AVX-512 with VNNI (vpdpbusd: 64 byte products per instruction).
// Built with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vnni; run only where the
// processor has them (int8_matmul.cpp checks).
#include <immintrin.h>

#include <bit>
#include <cstdint>

// GCC 12's AVX-512 headers build some results on `__m256d __Y = __Y;` (an intended
// undefined value), which -Werror=uninitialized rejects once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "cpu/int8_matmul.hpp"
#include "gguf/half.hpp"

#define TROUPE_INT8_NAMESPACE int8_avx512

namespace troupe::cpu::TROUPE_INT8_NAMESPACE {

#include "cpu/int8_bytes256.hpp"  // NOLINT(bugprone-suspicious-include): a copy per file

struct Ops {
  using Unit = __m512i;
  using Acc = __m512;
  static constexpr bool kWideUnsignedBytes = true;  // vpdpbusd sums byte products in int32

  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc load(const float* p) { return _mm512_loadu_ps(p); }
  static Acc mul(Acc a, Acc b) { return _mm512_mul_ps(a, b); }
  static Acc fma(Acc a, Acc b, Acc c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(Acc a) { return _mm512_reduce_add_ps(a); }
  static Acc lanes8(float s0, float s1) {
    return _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
  }
  static Acc set1(float f) { return _mm512_set1_ps(f); }
  static float half(std::uint16_t bits) { return _cvtsh_ss(bits); }
  static Acc halves8(std::uint16_t h0, std::uint16_t h1, std::uint16_t h2, std::uint16_t h3,
                     std::uint16_t h4, std::uint16_t h5, std::uint16_t h6, std::uint16_t h7) {
    return _mm512_zextps256_ps512(Bytes256::halves(h0, h1, h2, h3, h4, h5, h6, h7));
  }
  static Acc e8m0_halves8(std::uint64_t exponents) {
    return _mm512_zextps256_ps512(Bytes256::e8m0_halves(exponents));
  }
  static Acc words_u8(std::uint32_t w0, std::uint32_t w1, std::uint32_t w2, std::uint32_t w3) {
    const __m128i bytes = _mm_set_epi32(static_cast<int>(w3), static_cast<int>(w2),
                                        static_cast<int>(w1), static_cast<int>(w0));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
  }
  static Acc bytes_i8(const std::int8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static Acc spread8(Acc s, int k) {
    const __m512i base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(_mm512_add_epi32(base, _mm512_set1_epi32(2 * k)), s);
  }
  static Acc spread4(Acc s, int k) {
    const __m512i base = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(_mm512_add_epi32(base, _mm512_set1_epi32(4 * k)), s);
  }
  static Acc pairs_low(Acc s) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
                                 s);
  }
  static Acc pairs_high(Acc s) {
    return _mm512_permutexvar_ps(
        _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8), s);
  }
  static Unit load_x(const std::int8_t* q) { return _mm512_loadu_si512(q); }
  static Unit join(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  static Unit bytes2x32(const std::uint8_t* p0, const std::uint8_t* p1) {
    return join(Bytes256::load(p0), Bytes256::load(p1));
  }
  static Unit nibbles32(const std::uint8_t* p) {
    const __m256i b = Bytes256::load(p);
    return join(Bytes256::low_nibbles(b), Bytes256::high_nibbles(b));
  }
  // 32 bytes in both 256-bit halves (a broadcast load: no shuffle).
  static Unit both_halves(const std::uint8_t* p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // The words of the upper 256 bits.
  static constexpr __mmask32 kUpperWords = 0xFFFF0000u;
  static Unit nibbles16x2(const std::uint8_t* p0, const std::uint8_t* p1) {
    // [p0, p0, p1, p1] in 128-bit lanes by two broadcast loads and a blend, then the odd
    // lanes shifted to their high nibbles: no shuffle on the one port that does them.
    const __m512i b = _mm512_mask_blend_epi64(
        0xF0, _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0))),
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p1))));
    const __m512i shifted = _mm512_mask_srli_epi16(b, 0xFF00FF00u, b, 4);
    return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f));
  }
  static Unit crumbs32(const std::uint8_t* p, int shift) {
    const __m512i b = both_halves(p);
    const __m512i shifted =
        _mm512_mask_srli_epi16(_mm512_srli_epi16(b, static_cast<unsigned>(shift)), kUpperWords, b,
                               static_cast<unsigned>(shift + 2));
    return _mm512_and_si512(shifted, _mm512_set1_epi8(3));
  }
  static Unit lookup16(Unit idx, const std::uint8_t* table) {
    const __m512i t =
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
    return _mm512_shuffle_epi8(t, idx);
  }
  template <int kValue>
  static Unit with_high_bits(Unit u, const std::uint8_t* qh, int bit) {
    // Bit `bit` of the first 32 bytes, `bit + 1` of the copy in the upper half, as a mask.
    const __m512i bits =
        _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi8(static_cast<char>(1 << bit)),
                                _mm512_set1_epi8(static_cast<char>(2 << bit)));
    const __mmask64 set = _mm512_test_epi8_mask(both_halves(qh), bits);
    // The low bits leave this bit clear: adding kValue sets it.
    return _mm512_mask_add_epi8(u, set, u, _mm512_set1_epi8(kValue));
  }
  static Unit high_bits_2x32(Unit u, std::uint32_t qh0, std::uint32_t qh1) {
    const __mmask64 high = _cvtu64_mask64(qh0 | static_cast<std::uint64_t>(qh1) << 32);
    // The nibbles leave bit 4 clear: adding 16 sets it.
    return _mm512_mask_add_epi8(u, high, u, _mm512_set1_epi8(16));
  }
  static Unit q6(const std::uint8_t* ql, const std::uint8_t* qh, bool high, int shift) {
    const __m256i h = Bytes256::load(qh);
    return join(Bytes256::q6_quarter(ql, h, high, shift),
                Bytes256::q6_quarter(ql + 32, h, high, shift + 2));
  }
  static Acc dot_fma(Acc acc, Unit u, Unit q, Acc scale) {
    const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, q);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
  }
  static Acc dot_fma_signed(Acc acc, Unit w, Unit q, Acc scale) {
    // |w| times q with w's sign: vpdpbusd multiplies unsigned by signed bytes.
    const __mmask64 negative = _mm512_movepi8_mask(w);
    const Unit signed_q = _mm512_mask_sub_epi8(q, negative, _mm512_setzero_si512(), q);
    return dot_fma(acc, _mm512_abs_epi8(w), signed_q, scale);
  }
};

}  // namespace troupe::cpu::TROUPE_INT8_NAMESPACE
#include "cpu/int8_matmul_impl.hpp"
