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
        Case{TensorType::q4_k, 0.2f}, Case{TensorType::q5_k, 0.1f},
        Case{TensorType::q6_k, 0.05f}}) {
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
    float out[32];
    CHECK_FALSE(dequantize_row(TensorType::q2_k, nullptr, 256, out).has_value());
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
