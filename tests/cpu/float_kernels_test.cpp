// The float matmul kernels (F32, F16, BF16 weights) on every Highway target this
// processor runs, against a double-precision product of the decoded weights; the KV
// cache's F16 conversion against the scalar one.
#include <hwy/targets.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>

#include "cpu/kernels.hpp"
#include "gguf/dequantize.hpp"
#include "gguf/half.hpp"

using namespace troupe;
using gguf::TensorType;

TEST_CASE("the float kernels match the reference on every SIMD target here", "[cpu][simd]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto targets = hwy::SupportedAndGeneratedTargets();
  REQUIRE(!targets.empty());
  for (const std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    INFO("target " << hwy::TargetName(target) << " (dispatched: " << cpu::simd_target_name()
                   << ")");
    REQUIRE(std::string(cpu::simd_target_name()) == hwy::TargetName(target));
    for (const TensorType type : {TensorType::f32, TensorType::f16, TensorType::bf16}) {
      // Tiles of 4 x 4 with every edge, and a tail past the last full vector.
      const std::int64_t n = 6, rows = 9, cols = 83;
      std::vector<float> values(static_cast<std::size_t>(rows * cols)), x(n * cols);
      for (auto& v : values) v = normal(rng);
      for (auto& v : x) v = normal(rng);
      const auto bytes = *gguf::quantize(type, values, cols);
      const std::size_t row_bytes = gguf::row_bytes(type, cols);
      std::vector<float> decoded(values.size()), out(static_cast<std::size_t>(n * rows));
      for (std::int64_t r = 0; r < rows; ++r) {
        REQUIRE(gguf::dequantize_row(type, bytes.data() + r * row_bytes, cols,
                                     decoded.data() + r * cols)
                    .has_value());
      }
      cpu::matmul_tile_float(type, x.data(), cols, n, bytes.data(), row_bytes, rows, cols,
                             out.data(), rows);
      for (std::int64_t t = 0; t < n; ++t) {
        for (std::int64_t r = 0; r < rows; ++r) {
          double want = 0.0, magnitude = 0.0;
          for (std::int64_t k = 0; k < cols; ++k) {
            const double p = static_cast<double>(x[t * cols + k]) * decoded[r * cols + k];
            want += p;
            magnitude += std::fabs(p);
          }
          INFO(gguf::tensor_type_name(type) << " row " << t << ", weight row " << r);
          REQUIRE(std::fabs(out[t * rows + r] - want) <= 1e-6 * magnitude);
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to what the processor has
}

TEST_CASE("the KV cache's F16 conversion equals the scalar one on every SIMD target",
          "[cpu][simd]") {
  // Every kind of value: ordinary, subnormal in F16, halfway cases, past the range, the
  // infinities and NaN; 83 values so the tail past the last full vector is taken too.
  std::vector<float> in = {0.0f,
                           -0.0f,
                           1.0f,
                           -2.5f,
                           65504.0f,
                           65519.0f,
                           65520.0f,
                           -65520.0f,
                           1.0e9f,
                           -1.0e9f,
                           6.0e-8f,
                           3.0e-8f,
                           1.0e-10f,
                           1.00048828125f,
                           1.0009765625f,
                           2.0e-5f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f);
  std::uniform_int_distribution<std::uint32_t> bits;
  while (in.size() < 83) {
    in.push_back((bits(rng) & 1 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  }
  const auto targets = hwy::SupportedAndGeneratedTargets();
  for (const std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    INFO("target " << hwy::TargetName(target));
    std::vector<std::uint16_t> out(in.size());
    cpu::f32_to_f16_saturated_row(in.data(), out.data(), static_cast<std::int64_t>(in.size()));
    for (std::size_t i = 0; i < in.size(); ++i) {
      INFO("value " << in[i]);
      const std::uint16_t want = gguf::f32_to_f16_saturated(in[i]);
      if (std::isnan(in[i])) {
        CHECK((out[i] & 0x7c00u) == 0x7c00u);
        CHECK((out[i] & 0x3ffu) != 0u);
      } else {
        CHECK(out[i] == want);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}
