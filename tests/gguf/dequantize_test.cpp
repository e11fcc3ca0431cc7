#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>

#include "gguf/dequantize.hpp"
#include "gguf/half.hpp"

using namespace troupe;
using namespace troupe::gguf;

TEST_CASE("f16 conversion is exact for every half value and rounds to nearest even", "[half]") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_f16(f) == h);
  }
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));         // smallest subnormal
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie: to even
  CHECK(f32_to_f16(1e6f) == 0x7c00);                          // overflow: infinity
  CHECK(f32_to_f16(65504.0f) == 0x7bff);
}

TEST_CASE("bf16 keeps the top half of a float, rounded", "[half]") {
  CHECK(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  CHECK(bf16_to_f32(f32_to_bf16(3.14159f)) == Approx(3.14159f).epsilon(1e-2));
}

TEST_CASE("quantize then dequantize stays within each type's error", "[quant]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(256);
  for (auto& v : values) v = normal(rng);
  struct Case {
    TensorType type;
    float tolerance;  // relative to the block's largest magnitude
  };
  for (const Case c :
       {Case{TensorType::f32, 0.0f}, Case{TensorType::f16, 1e-3f}, Case{TensorType::bf16, 1e-2f},
        Case{TensorType::q8_0, 1.0f / 127}, Case{TensorType::q4_0, 1.0f / 7},
        // Q4_1 and Q5_1: half a step of the block's range (at most twice its magnitude),
        // plus f16's rounding of d and m; Q5_0 as Q4_0, in 16 steps.
        Case{TensorType::q4_1, 1.0f / 14}, Case{TensorType::q5_0, 1.0f / 15},
        Case{TensorType::q5_1, 1.0f / 30},
        // The K-quants' plain min/max encoder: half a step of the block's range, plus the
        // rounding of each block's scale to 6 (Q6_K: 8) bits of the largest one.
        Case{TensorType::q4_k, 0.2f}, Case{TensorType::q5_k, 0.1f}, Case{TensorType::q6_k, 0.05f},
        // ggml's reference quantizers, bounded with a margin over 2000 random vectors: Q2_K
        // (4 levels, a fitted minimum that may clip) 0.44, Q3_K 0.25, IQ4_NL and IQ4_XS 0.14;
        // MXFP4 at most half its widest gap (8 to 12 doubled), a quarter of the magnitude.
        Case{TensorType::q2_k, 0.5f}, Case{TensorType::q3_k, 0.3f}, Case{TensorType::iq4_nl, 0.15f},
        Case{TensorType::iq4_xs, 0.15f}, Case{TensorType::mxfp4, 0.2501f}}) {
    INFO(tensor_type_name(c.type));
    const auto bytes = quantize(c.type, values, 256);
    REQUIRE(bytes.has_value());
    CHECK(bytes->size() == row_bytes(c.type, 256));
    std::vector<float> back(256);
    REQUIRE(dequantize_row(c.type, bytes->data(), 256, back.data()).has_value());
    for (std::size_t b = 0; b < 256; b += 32) {
      float amax = 0.0f;
      for (std::size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(values[i]));
      for (std::size_t i = b; i < b + 32; ++i) {
        REQUIRE(std::fabs(back[i] - values[i]) <= c.tolerance * amax + 1e-6f);
      }
    }
  }
}

TEST_CASE("Q4_K and Q6_K blocks decode by ggml's layout", "[quant]") {
  SECTION("Q4_K: scale 1, min 0, nibble j -> j") {
    std::vector<std::uint8_t> block(144, 0);
    const std::uint16_t one = f32_to_f16(1.0f);
    std::memcpy(block.data(), &one, 2);  // d
    block[4] = 1;                        // sub-block 0 scale 1
    for (int l = 0; l < 32; ++l) block[16 + l] = static_cast<std::uint8_t>(l % 16);
    std::vector<float> out(256);
    REQUIRE(dequantize_row(TensorType::q4_k, block.data(), 256, out.data()).has_value());
    CHECK(out[5] == 5.0f);
    CHECK(out[31] == 15.0f);
    CHECK(out[32] == 0.0f);  // sub-block 1 has scale 0
  }
  SECTION("Q6_K: value = d * scale * (q - 32)") {
    std::vector<std::uint8_t> block(210, 0);
    const std::uint16_t half = f32_to_f16(0.5f);
    std::memcpy(block.data() + 208, &half, 2);
    for (int i = 0; i < 16; ++i) block[192 + i] = 2;
    std::vector<float> out(256);
    REQUIRE(dequantize_row(TensorType::q6_k, block.data(), 256, out.data()).has_value());
    CHECK(out[0] == 0.5f * 2 * -32);
  }
  SECTION("Q5_K: the fifth bit comes from qh") {
    std::vector<std::uint8_t> block(176, 0);
    const std::uint16_t one = f32_to_f16(1.0f);
    std::memcpy(block.data(), &one, 2);  // d; dmin stays 0
    block[4] = 1;                        // sub-block 0 scale 1
    block[16 + 3] = 1;                   // qh: element 3 of sub-block 0 gets +16
    block[48 + 3] = 0x02;                // low nibble 2
    std::vector<float> out(256);
    REQUIRE(dequantize_row(TensorType::q5_k, block.data(), 256, out.data()).has_value());
    CHECK(out[3] == 18.0f);
    CHECK(out[2] == 0.0f);
  }
  SECTION("Q4_1, Q5_0 and Q5_1 follow ggml's block layouts") {
    const std::uint16_t two = f32_to_f16(2.0f), half = f32_to_f16(0.5f);
    std::vector<std::uint8_t> q41(20, 0);
    std::memcpy(q41.data(), &two, 2);
    std::memcpy(q41.data() + 2, &half, 2);
    q41[4] = 0x73;  // element 0: 3, element 16: 7
    std::vector<float> out(32);
    REQUIRE(dequantize_row(TensorType::q4_1, q41.data(), 32, out.data()).has_value());
    CHECK(out[0] == 6.5f);
    CHECK(out[16] == 14.5f);
    std::vector<std::uint8_t> q50(22, 0);
    std::memcpy(q50.data(), &two, 2);
    q50[2 + 2] = 0x01;  // qh bit 16: element 16 gets +16
    q50[6] = 0x41;      // element 0: 1, element 16: 4
    REQUIRE(dequantize_row(TensorType::q5_0, q50.data(), 32, out.data()).has_value());
    CHECK(out[0] == 2.0f * (1 - 16));
    CHECK(out[16] == 2.0f * (4 + 16 - 16));
    std::vector<std::uint8_t> q51(24, 0);
    std::memcpy(q51.data(), &two, 2);
    std::memcpy(q51.data() + 2, &half, 2);
    q51[4] = 0x01;  // qh bit 0: element 0 gets +16
    q51[8] = 0x03;
    REQUIRE(dequantize_row(TensorType::q5_1, q51.data(), 32, out.data()).has_value());
    CHECK(out[0] == 2.0f * 19 + 0.5f);
  }
  SECTION("an undecodable type is an error") {
    float out[256];
    const auto decoded = dequantize_row(TensorType::iq2_xxs, nullptr, 256, out);
    REQUIRE_FALSE(decoded.has_value());
    CHECK(decoded.error().message == "cannot decode tensor type IQ2_XXS");
  }
}

namespace {

void put_half(std::vector<std::uint8_t>& block, std::size_t at, float value) {
  const std::uint16_t bits = f32_to_f16(value);
  std::memcpy(block.data() + at, &bits, 2);
}

std::vector<float> decode(TensorType type, const std::vector<std::uint8_t>& block, int cols) {
  std::vector<float> out(static_cast<std::size_t>(cols));
  REQUIRE(dequantize_row(type, block.data(), cols, out.data()).has_value());
  return out;
}

}  // namespace

TEST_CASE("Q2_K and Q3_K blocks decode by ggml's layout", "[quant]") {
  SECTION("Q2_K: d * scale * q - dmin * minimum, per group of 16") {
    std::vector<std::uint8_t> block(84, 0);
    put_half(block, 80, 1.0f);  // d
    put_half(block, 82, 0.5f);  // dmin
    block[0] = 0x21;            // group 0 (values 0-15): scale 1, minimum 2
    block[2] = 0x13;            // group 2 (values 32-47): scale 3, minimum 1
    block[6] = 0x05;            // group 6 (values 96-111): scale 5, minimum 0
    block[8] = 0x01;            // group 8 (values 128-143): scale 1
    block[16] = 0b11100100;     // byte 0 of the first half: values 0, 32, 64, 96 are 0, 1, 2, 3
    block[16 + 32] = 0x02;      // byte 0 of the second half: value 128 is 2
    const auto out = decode(TensorType::q2_k, block, 256);
    CHECK(out[0] == 1.0f * 0 - 0.5f * 2);
    CHECK(out[32] == 3.0f * 1 - 0.5f * 1);
    CHECK(out[64] == 0.0f);  // group 4: scale and minimum 0
    CHECK(out[96] == 5.0f * 3);
    CHECK(out[128] == 2.0f);
    CHECK(out[16] == 0.0f);
  }
  SECTION("Q3_K: d * (scale - 32) * (q - 4 unless the high bit is set)") {
    std::vector<std::uint8_t> block(110, 0);
    put_half(block, 108, 0.5f);
    // Scales (stored + 32): group 0 -> 1 (33), group 5 -> -2 (30), group 12 -> 8 (40). Low
    // nibbles of groups 0-7 in bytes 96-103, of 8-15 in their high halves, top bits in 104-107.
    block[96 + 0] = 33 & 0xF;
    block[104 + 0] = 33 >> 4;
    block[96 + 5] = 30 & 0xF;
    block[104 + 1] = (30 >> 4) << 2;
    block[96 + 4] = (40 & 0xF) << 4;
    block[104 + 0] |= (40 >> 4) << 6;
    // Value 0: 2 bits 1 (byte 0 of qs at 32, bits 0-1), high bit set (hmask[0] bit 0): 1.
    block[32 + 0] = 0b01;
    block[0] = 0x01;
    // Value 80 (group 5): byte 16 of the first half, bits 4-5 = 3, no high bit: 3 - 4 = -1.
    block[32 + 16] = 0b11 << 4;
    // Value 192 (group 12): byte 0 of the second half, bits 4-5 = 2, high bit 6 of hmask[0].
    block[64 + 0] = 0b10 << 4;
    block[0] |= 1 << 6;
    const auto out = decode(TensorType::q3_k, block, 256);
    CHECK(out[0] == 0.5f * 1 * 1);
    CHECK(out[80] == 0.5f * -2 * -1);
    CHECK(out[192] == 0.5f * 8 * 2);
    CHECK(out[1] == 0.5f * 1 * -4);  // all bits clear: the lowest level
  }
}

TEST_CASE("IQ4_NL, IQ4_XS and MXFP4 blocks decode through their tables", "[quant]") {
  SECTION("IQ4_NL: d times the non-linear level each nibble picks") {
    std::vector<std::uint8_t> block(18, 0);
    put_half(block, 0, 0.5f);
    block[2 + 0] = 0xF0;  // value 0: level 0 (-127), value 16: level 15 (113)
    block[2 + 3] = 0x98;  // value 3: level 8 (1), value 19: level 9 (13)
    const auto out = decode(TensorType::iq4_nl, block, 32);
    CHECK(out[0] == 0.5f * -127);
    CHECK(out[16] == 0.5f * 113);
    CHECK(out[3] == 0.5f * 1);
    CHECK(out[19] == 0.5f * 13);
  }
  SECTION("IQ4_XS: d * (6-bit block scale - 32) times the level") {
    std::vector<std::uint8_t> block(136, 0);
    put_half(block, 0, 0.25f);
    // Block 0's scale 33 (+1): low nibble in scales_l[0], top bits 0-1 of scales_h; block 3's
    // 28 (-4): high nibble of scales_l[1], bits 6-7 of scales_h.
    const std::uint16_t scales_h = (33 >> 4) | (28 >> 4) << 6;
    std::memcpy(block.data() + 2, &scales_h, 2);
    block[4] = 33 & 0xF;
    block[5] = (28 & 0xF) << 4;
    block[8 + 0] = 0x0F;       // block 0: value 0 level 15, value 16 level 0
    block[8 + 48 + 0] = 0x07;  // block 3: value 96 level 7 (-10), value 112 level 0
    const auto out = decode(TensorType::iq4_xs, block, 256);
    CHECK(out[0] == 0.25f * 1 * 113);
    CHECK(out[16] == 0.25f * 1 * -127);
    CHECK(out[96] == 0.25f * -4 * -10);
    CHECK(out[112] == 0.25f * -4 * -127);
    CHECK(out[32] == 0.25f * -32 * -127);  // block 1: scale 0 stored, so -32
  }
  SECTION("MXFP4: 2^(e - 128) times the doubled FP4 level") {
    std::vector<std::uint8_t> block(17, 0);
    block[0] = 127;       // 2^-1: the doubled levels come back as FP4's own values
    block[1 + 0] = 0x7F;  // value 0: level 15 (-12 -> -6), value 16: level 7 (12 -> 6)
    block[1 + 1] = 0x95;  // value 1: level 5 (6 -> 3), value 17: level 9 (-1 -> -0.5)
    auto out = decode(TensorType::mxfp4, block, 32);
    CHECK(out[0] == -6.0f);
    CHECK(out[16] == 6.0f);
    CHECK(out[1] == 3.0f);
    CHECK(out[17] == -0.5f);
    CHECK(out[2] == 0.0f);
    block[0] = 0;  // the smallest exponent: 2^-128, a subnormal float
    out = decode(TensorType::mxfp4, block, 32);
    CHECK(out[1] == std::ldexp(6.0f, -128));
    block[0] = 255;
    out = decode(TensorType::mxfp4, block, 32);
    CHECK(out[16] == std::ldexp(12.0f, 127));
  }
}

TEST_CASE("the low-bit encoders write what ggml's reference quantizers write", "[quant]") {
  // One fixed input (exact in float: no library function involved in making it), its bytes
  // hashed (FNV-1a). The hashes are of ggml's own quantize_row_*_ref output for this input
  // (ggml d99724f, 2026-08-21, built for the comparison); the same check over random
  // vectors of six distributions matched byte for byte.
  std::vector<float> x(512);
  for (int i = 0; i < 512; ++i) {
    x[i] = static_cast<float>((i * 7919 + 13) % 2001 - 1000) / 400.0f *
           static_cast<float>(1 + (i / 32) % 3);
  }
  auto fnv1a = [](const std::vector<std::byte>& bytes) {
    std::uint64_t h = 1469598103934665603ULL;
    for (const std::byte b : bytes) h = (h ^ static_cast<std::uint8_t>(b)) * 1099511628211ULL;
    return h;
  };
  for (const auto& [type, hash] : {std::pair{TensorType::q2_k, 0x5e0210f46f1cf12fULL},
                                   std::pair{TensorType::q3_k, 0xe121853f0987d825ULL},
                                   std::pair{TensorType::iq4_nl, 0x4fd6989262a7dd69ULL},
                                   std::pair{TensorType::iq4_xs, 0x040b122b039c10d1ULL},
                                   std::pair{TensorType::mxfp4, 0x395d569d5a9f49a8ULL}}) {
    INFO(tensor_type_name(type));
    const auto bytes = quantize(type, x, 512);
    REQUIRE(bytes.has_value());
    CHECK(fnv1a(*bytes) == hash);
  }
}

TEST_CASE("the low-bit encoders on values they can hold, and on zeros", "[quant]") {
  SECTION("MXFP4: the exponent from the largest magnitude, each value its nearest level") {
    std::vector<float> x(32, 0.0f);
    x[0] = 6.0f;   // 2^2 <= 6 < 2^3: e = 2 - 2 + 127, so steps of 0.5; 6 is level 7
    x[1] = -6.0f;  // level 15
    x[2] = 0.25f;  // halfway between 0 and 0.5: the lower index, 0
    x[16] = 1.4f;  // nearest 1.5: level 3
    const auto bytes = quantize(TensorType::mxfp4, x, 32);
    REQUIRE(bytes.has_value());
    const auto* b = reinterpret_cast<const std::uint8_t*>(bytes->data());
    CHECK(b[0] == 127);
    CHECK(b[1] == (7 | 3 << 4));
    CHECK(b[2] == 15);
    CHECK(b[3] == 0);
  }
  SECTION("IQ4_NL: values on the levels keep their levels") {
    std::vector<float> x(32);
    for (int i = 0; i < 32; ++i) x[i] = 0.01f * kIq4NlValues[i % 16];
    const auto bytes = quantize(TensorType::iq4_nl, x, 32);
    REQUIRE(bytes.has_value());
    const auto* b = reinterpret_cast<const std::uint8_t*>(bytes->data());
    for (int i = 0; i < 16; ++i) CHECK(b[2 + i] == (i | i << 4));
    std::vector<float> back(32);
    REQUIRE(dequantize_row(TensorType::iq4_nl, b, 32, back.data()).has_value());
    for (int i = 0; i < 32; ++i) CHECK(back[i] == Approx(x[i]).epsilon(1e-3));
  }
  SECTION("Q3_K: values on one grid of eighths come back exactly") {
    // Each group of 16 holds -4 (its largest magnitude) and levels -4..3 of 1/8: every group's
    // scale is 1/8, stored as 6-bit -32 over d = -1/256.
    std::vector<float> x(256);
    for (int i = 0; i < 256; ++i) x[i] = static_cast<float>(i % 16 == 0 ? -4 : i * 5 % 8 - 4) / 8;
    const auto bytes = quantize(TensorType::q3_k, x, 256);
    REQUIRE(bytes.has_value());
    std::vector<float> back(256);
    REQUIRE(dequantize_row(TensorType::q3_k, bytes->data(), 256, back.data()).has_value());
    CHECK(back == x);
  }
  for (const TensorType type : {TensorType::q2_k, TensorType::q3_k, TensorType::iq4_nl,
                                TensorType::iq4_xs, TensorType::mxfp4}) {
    INFO(tensor_type_name(type) << ": zeros decode to zeros");
    const std::vector<float> zeros(256, 0.0f);
    const auto bytes = quantize(type, zeros, 256);
    REQUIRE(bytes.has_value());
    std::vector<float> back(256, 1.0f);
    REQUIRE(dequantize_row(type, bytes->data(), 256, back.data()).has_value());
    CHECK(back == zeros);
  }
}

TEST_CASE("the KV cache's half conversion saturates where the plain one overflows", "[gguf]") {
  CHECK(f32_to_f16(1e6f) == 0x7c00u);            // +inf
  CHECK(f32_to_f16_saturated(1e6f) == 0x7bffu);  // 65504
  CHECK(f32_to_f16_saturated(-1e6f) == 0xfbffu);
  CHECK(f32_to_f16_saturated(std::numeric_limits<float>::infinity()) == 0x7bffu);
  CHECK(f16_to_f32(f32_to_f16_saturated(65519.0f)) == 65504.0f);
  CHECK(std::isnan(f16_to_f32(f32_to_f16_saturated(std::nanf("")))));
  // Within range, the same rounding as the plain conversion.
  for (const float x : {0.0f, -0.0f, 1.0f, 3.14159f, -2.5e-5f, 65504.0f, 1e-8f}) {
    CHECK(f32_to_f16_saturated(x) == f32_to_f16(x));
  }
}
