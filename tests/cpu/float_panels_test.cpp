// Float weights repacked into panels of 16 rows (F32, F16, BF16): on every SIMD target this
// processor runs, the kernel equals the scalar reference bit for bit where the target fuses
// multiply and add, is within rounding of a double-precision product everywhere, and gives a
// row the same bits alone, in any batch and in any split of the weight rows. The backend's
// matmul runs through the panels.
#include <hwy/targets.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "cpu/cpu_backend.hpp"
#include "cpu/float_panels.hpp"
#include "cpu/kernels.hpp"
#include "gguf/dequantize.hpp"
#include "support/int8_weights.hpp"

using namespace troupe;
using namespace troupe::cpu;
using gguf::TensorType;

namespace {

struct FloatWeights {
  std::vector<std::byte> bytes;
  std::size_t row_bytes = 0;
  std::vector<float> decoded;  // [rows, cols] what the bytes hold
};

FloatWeights make_weights(TensorType type, std::int64_t rows, std::int64_t cols,
                          std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  for (auto& v : values) v = normal(rng);
  FloatWeights w;
  w.bytes = *gguf::quantize(type, values, cols);
  w.row_bytes = gguf::row_bytes(type, cols);
  w.decoded.resize(values.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    REQUIRE(gguf::dequantize_row(type, w.bytes.data() + r * w.row_bytes, cols,
                                 w.decoded.data() + r * cols)
                .has_value());
  }
  return w;
}

RepackedWeight panels(const FloatWeights& w, TensorType type, std::int64_t rows,
                      std::int64_t cols) {
  RepackedWeight packed = allocate_float_panels(type, rows, cols);
  for (std::int64_t g = 0; g < packed.groups; ++g) {
    repack_float_group(packed, w.bytes.data(), w.row_bytes, g);
  }
  return packed;
}

std::vector<float> random_rows(std::int64_t n, std::int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n * cols));
  for (auto& v : x) v = normal(rng);
  return x;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

}  // namespace

TEST_CASE("float panels equal the reference on every SIMD target, in any batch or split",
          "[cpu][simd]") {
  std::mt19937 rng(11);
  const auto targets = hwy::SupportedAndGeneratedTargets();
  REQUIRE(!targets.empty());
  for (const std::int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    INFO("target " << hwy::TargetName(target) << ", fused multiply-add "
                   << (float_panels_fused() ? "yes" : "no"));
    for (const TensorType type : {TensorType::f32, TensorType::f16, TensorType::bf16}) {
      // Rows: a partial last group, and enough groups for the 3-panel and 4-panel tiles with
      // remainders; activation rows: whole tiles and every size of the last, short tile (8 a
      // tile on AVX-512, 6 on AVX2, 3 on SSE4).
      for (const auto& [rows, cols, n] :
           {std::tuple<std::int64_t, std::int64_t, std::int64_t>{85, 37, 11},
            {16, 64, 11},
            {85, 37, 2},
            {85, 37, 4},
            {85, 37, 7},
            {16, 64, 13},
            {85, 37, 14},
            {85, 37, 15}}) {
        INFO(gguf::tensor_type_name(type)
             << ", " << rows << " x " << cols << ", " << n << " activation rows");
        const FloatWeights w = make_weights(type, rows, cols, rng);
        const RepackedWeight packed = panels(w, type, rows, cols);
        const std::vector<float> x = random_rows(n, cols, rng);
        std::vector<float> got(static_cast<std::size_t>(n * rows), -1.0f), want(got.size(), -2.0f);
        float_panels_matmul(packed, x.data(), cols, n, 0, packed.groups, got.data(), rows);
        float_panels_reference(packed, x.data(), cols, n, 0, packed.groups, want.data(), rows);
        for (std::int64_t t = 0; t < n; ++t) {
          for (std::int64_t r = 0; r < rows; ++r) {
            const std::size_t i = static_cast<std::size_t>(t * rows + r);
            INFO("row " << t << ", weight row " << r);
            if (float_panels_fused()) REQUIRE(same_bits(got[i], want[i]));
            double exact = 0.0, magnitude = 0.0;
            for (std::int64_t k = 0; k < cols; ++k) {
              const double p = static_cast<double>(x[t * cols + k]) * w.decoded[r * cols + k];
              exact += p;
              magnitude += std::fabs(p);
            }
            REQUIRE(std::fabs(got[i] - exact) <= 1e-6 * magnitude);
          }
        }
        // Each row alone, and the groups split in two calls: the same bits.
        for (std::int64_t t = 0; t < n; ++t) {
          std::vector<float> alone(static_cast<std::size_t>(rows), -3.0f);
          const std::int64_t split = packed.groups / 2;
          float_panels_matmul(packed, x.data() + t * cols, cols, 1, 0, split, alone.data(), rows);
          float_panels_matmul(packed, x.data() + t * cols, cols, 1, split, packed.groups,
                              alone.data(), rows);
          for (std::int64_t r = 0; r < rows; ++r) {
            INFO("row " << t << " alone, weight row " << r);
            REQUIRE(same_bits(alone[r], got[static_cast<std::size_t>(t * rows + r)]));
          }
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to what the processor has
}

TEST_CASE("float panels write no row past the weight's last", "[cpu]") {
  std::mt19937 rng(3);
  const std::int64_t rows = 20, cols = 24, n = 9;
  const FloatWeights w = make_weights(TensorType::f16, rows, cols, rng);
  const RepackedWeight packed = panels(w, TensorType::f16, rows, cols);
  REQUIRE(packed.groups == 2);
  const std::vector<float> x = random_rows(n, cols, rng);
  // Output rows of rows + 5 columns: the 5 past the weight's rows keep their sentinel.
  const std::int64_t stride = rows + 5;
  std::vector<float> out(static_cast<std::size_t>(n * stride), 7.0f);
  float_panels_matmul(packed, x.data(), cols, n, 0, packed.groups, out.data(), stride);
  for (std::int64_t t = 0; t < n; ++t) {
    for (std::int64_t c = rows; c < stride; ++c) CHECK(out[t * stride + c] == 7.0f);
  }
}

TEST_CASE("a NaN activation gives NaN through the float panels", "[cpu]") {
  std::mt19937 rng(5);
  const std::int64_t rows = 16, cols = 32;
  const FloatWeights w = make_weights(TensorType::f16, rows, cols, rng);
  const RepackedWeight packed = panels(w, TensorType::f16, rows, cols);
  std::vector<float> x = random_rows(1, cols, rng);
  x[7] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(static_cast<std::size_t>(rows));
  float_panels_matmul(packed, x.data(), cols, 1, 0, packed.groups, out.data(), rows);
  for (const float v : out) CHECK(std::isnan(v));
}

TEST_CASE("the CPU backend's float matmul runs through the panels, alone or batched", "[cpu]") {
  std::mt19937 rng(9);
  const std::int64_t rows = 100, cols = 48, n = 13;
  for (const TensorType type : {TensorType::f32, TensorType::f16, TensorType::bf16}) {
    INFO(gguf::tensor_type_name(type));
    const FloatWeights w = make_weights(type, rows, cols, rng);
    const gguf::GgufTensorInfo info = test::matrix_info(type, rows, cols, w.bytes);
    CpuBackend backend(2);
    const model::Weight weight = *backend.load_weight(info);
    std::vector<float> x = random_rows(n, cols, rng), out(static_cast<std::size_t>(n * rows));
    backend.matmul({x.data(), n, cols}, weight, {out.data(), n, rows});
    const RepackedWeight packed = panels(w, type, rows, cols);
    std::vector<float> want(out.size());
    float_panels_matmul(packed, x.data(), cols, n, 0, packed.groups, want.data(), rows);
    for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(same_bits(out[i], want[i]));
    // One row at a time: the same bits as in the batch.
    for (std::int64_t t = 0; t < n; ++t) {
      std::vector<float> one(static_cast<std::size_t>(rows));
      backend.matmul({x.data() + t * cols, 1, cols}, weight, {one.data(), 1, rows});
      for (std::int64_t r = 0; r < rows; ++r) REQUIRE(same_bits(one[r], out[t * rows + r]));
    }
  }
}
