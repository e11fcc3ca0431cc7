// 256-bit byte helpers the AVX2, AVX-VNNI and AVX-512 int8 files share. Included inside
// each file's own namespace, so that each keeps its own copy built with its own flags
// (one shared inline copy could carry AVX-512 encodings into the AVX2 path). The includer
// has included <immintrin.h>, <bit> and <cstdint> at file scope.
#pragma once

struct Bytes256 {
  // Eight F16 values (given as their bits) as eight floats.
  static __m256 halves(std::uint16_t h0, std::uint16_t h1, std::uint16_t h2, std::uint16_t h3,
                       std::uint16_t h4, std::uint16_t h5, std::uint16_t h6, std::uint16_t h7) {
    const __m128i bits =
        _mm_set_epi16(static_cast<short>(h7), static_cast<short>(h6), static_cast<short>(h5),
                      static_cast<short>(h4), static_cast<short>(h3), static_cast<short>(h2),
                      static_cast<short>(h1), static_cast<short>(h0));
    return _mm256_cvtph_ps(bits);
  }
  static __m256i load(const std::uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static __m256i low_nibbles(__m256i b) { return _mm256_and_si256(b, _mm256_set1_epi8(0x0f)); }
  static __m256i high_nibbles(__m256i b) { return low_nibbles(_mm256_srli_epi16(b, 4)); }
  // kValue (a power of two) where bit `bit` of each byte of qh is set, else 0 (Q5_K's fifth
  // bit: 16; Q3_K's third: 4).
  template <int kValue>
  static __m256i bit_to(__m256i qh, int bit) {
    const __m256i shifted = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(bit));
    return _mm256_slli_epi16(_mm256_and_si256(shifted, _mm256_set1_epi8(1)),
                             std::countr_zero(unsigned{kValue}));
  }
  // Bits shift, shift+1 of each byte of p[0..32) (Q2_K's and Q3_K's 2-bit values).
  static __m256i crumbs(__m256i b, int shift) {
    return _mm256_and_si256(_mm256_srl_epi16(b, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3));
  }
  // Each byte (0-15) of idx replaced by table[byte].
  static __m256i lookup16(__m256i idx, const std::uint8_t* table) {
    const __m256i t =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
    return _mm256_shuffle_epi8(t, idx);
  }
  // 2^(e - 128) for the 8 bytes e of a little-endian word, as floats: (e - 1) << 23 as the
  // float's bits, and for e 0 and 1 the subnormals 2^-128 and 2^-127.
  static __m256 e8m0_halves(std::uint64_t exponents) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(exponents)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small));
  }
  // Q6_K's 32 values of one quarter: a nibble of ql[0..32) with bits shift, shift+1 of qh.
  static __m256i q6_quarter(const std::uint8_t* ql, __m256i qh, bool high, int shift) {
    const __m256i b = load(ql);
    const __m256i nibble = high ? high_nibbles(b) : low_nibbles(b);
    const __m256i top =
        _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), _mm256_set1_epi8(3));
    return _mm256_or_si256(nibble, _mm256_slli_epi16(top, 4));
  }
};
