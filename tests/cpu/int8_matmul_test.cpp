// The int8 kernels (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K, IQ4_XS against int8 activations) on every path this processor can run, against a
// double-precision product of the scalar decoder's weights and the activations as quantized; and a
// row's result alone and in a batch.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "cpu/int8_matmul.hpp"
#include "gguf/dequantize.hpp"
#include "gguf/half.hpp"
#include "support/int8_weights.hpp"

using namespace troupe;
using namespace troupe::cpu;
using gguf::TensorType;
using test::make_weights;
using test::random_bits;
using test::random_floats;

namespace {

const TensorType kTypes[] = {
    TensorType::q8_0,   TensorType::q4_0,  TensorType::q4_1,  TensorType::q5_0, TensorType::q5_1,
    TensorType::iq4_nl, TensorType::mxfp4, TensorType::q2_k,  TensorType::q3_k, TensorType::q4_k,
    TensorType::q5_k,   TensorType::q6_k,  TensorType::iq4_xs};

// Row lengths with a partial last chunk: the blocks of 32 only.
std::vector<std::int64_t> widths(TensorType type, std::vector<std::int64_t> whole,
                                 const std::vector<std::int64_t>& partial) {
  if (is_block32(type)) whole.insert(whole.end(), partial.begin(), partial.end());
  return whole;
}

std::string shape_name(TensorType type, Int8Path path, std::int64_t n, std::int64_t rows,
                       std::int64_t cols) {
  return std::string(gguf::tensor_type_name(type)) + " on " + std::string(int8_path_name(path)) +
         ", " + std::to_string(n) + " x " + std::to_string(rows) + " x " + std::to_string(cols);
}

}  // namespace

TEST_CASE("every int8 kernel on every path matches the scalar decoder's product", "[cpu][int8]") {
  INFO("paths here: " << supported_int8_paths().size());
  for (const TensorType type : kTypes) {
    // Tiles of 4 x 2 and 1 x 4 with every edge; rows of blocks of 32 that end in a partial
    // chunk (896: Qwen2-0.5B's width, 3.5 chunks).
    for (const std::int64_t cols : widths(type, {256, 512}, {32, 96, 288, 800, 896})) {
      for (const auto& [n, rows] : {std::pair{1, 7}, std::pair{5, 9}, std::pair{9, 33}}) {
        const auto w = make_weights(type, rows, cols, random_bits(type));
        const auto xs = random_floats(static_cast<std::size_t>(n * cols), 1.0f);
        Int8RowBuffer buffer;
        buffer.resize(n, cols);
        for (std::int64_t t = 0; t < n; ++t) buffer.quantize_row(t, xs.data() + t * cols);
        const Int8Rows x = buffer.rows();
        for (const Int8Path path : supported_int8_paths()) {
          INFO(shape_name(type, path, n, rows, cols));
          std::vector<float> out(static_cast<std::size_t>(n * rows),
                                 std::numeric_limits<float>::quiet_NaN());
          int8_matmul_on(path, type, x, n, w.bytes.data(), w.row_bytes, rows, out.data(), rows);
          for (std::int64_t t = 0; t < n; ++t) {
            for (std::int64_t r = 0; r < rows; ++r) {
              // The reference: the decoded weights times the activations as quantized.
              double want = 0.0, magnitude = 0.0;
              for (std::int64_t k = 0; k < cols; ++k) {
                const double xq =
                    static_cast<double>(x.q[t * cols + k]) * x.lane_scales[(t * cols + k) / 4];
                const double p = xq * w.decoded[r * cols + k];
                want += p;
                magnitude += std::fabs(p);
              }
              const float got = out[t * rows + r];
              INFO("row " << t << ", weight row " << r << ": got " << got << ", want " << want);
              REQUIRE(std::isfinite(got));
              REQUIRE(std::fabs(got - want) <= 2e-6 * magnitude + 1e-6);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the int8 activations hold each block's scale and scaled sums", "[cpu][int8]") {
  const std::int64_t cols = 64;
  auto xs = random_floats(cols, 3.0f);
  xs[5] = -10.0f;  // the first block's largest magnitude: it quantizes to -127 exactly
  Int8RowBuffer buffer;
  buffer.resize(1, cols);
  buffer.quantize_row(0, xs.data());
  const Int8Rows x = buffer.rows();
  REQUIRE(x.q[5] == -127);
  REQUIRE(x.lane_scales[0] == Approx(10.0f / 127.0f));
  for (std::int64_t l = 0; l < cols / 4; ++l) REQUIRE(x.lane_scales[l] == x.lane_scales[l / 8 * 8]);
  for (std::int64_t g = 0; g < cols / 16; ++g) {
    int sum = 0;
    for (std::int64_t i = 16 * g; i < 16 * g + 16; ++i) sum += x.q[i];
    REQUIRE(x.sums[g] == Approx(x.lane_scales[g * 4] * static_cast<float>(sum)));
  }
  for (std::int64_t k = 0; k < cols; ++k) {
    REQUIRE(std::fabs(x.q[k] * x.lane_scales[k / 4] - xs[k]) <=
            0.5f * x.lane_scales[k / 4] + 1e-6f);
  }
}

TEST_CASE("the vectorised int8 quantizer gives the scalar definition's bits", "[cpu][int8]") {
  // Blocks of every kind: random, all zero, one with values that fall on halves after
  // scaling (ties round to even), and a wide one.
  const std::int64_t cols = 256;
  auto xs = random_floats(cols, 1.0f);
  std::fill_n(xs.begin() + 32, 32, 0.0f);
  for (int i = 0; i < 32; ++i)
    xs[64 + i] = static_cast<float>(i - 16) * 0.5f + (i == 0 ? -119.5f : 0.0f);
  for (int i = 0; i < 32; ++i) xs[96 + i] *= 1e6f;
  Int8RowBuffer buffer;
  buffer.resize(1, cols);
  buffer.quantize_row(0, xs.data());
  const Int8Rows x = buffer.rows();
  for (std::int64_t b = 0; b < cols / 32; ++b) {
    INFO("block " << b);
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xs[b * 32 + i]));
    const float scale = amax / 127.0f;
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    REQUIRE(std::memcmp(&x.lane_scales[b * 8], &scale, sizeof scale) == 0);
    for (int g = 0; g < 2; ++g) {
      std::int32_t sum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) {
        const auto want = static_cast<std::int8_t>(std::nearbyint(xs[b * 32 + i] * inverse));
        REQUIRE(x.q[b * 32 + i] == want);
        sum += want;
      }
      REQUIRE(x.int_sums[2 * b + g] == sum);
      const float scaled = scale * static_cast<float>(sum);
      REQUIRE(std::memcmp(&x.sums[2 * b + g], &scaled, sizeof scaled) == 0);
    }
  }
}

TEST_CASE("a NaN or infinite activation gives NaN products on every path", "[cpu][int8]") {
  const std::int64_t rows = 3, cols = 288;  // a whole chunk and a tail block
  for (const TensorType type : kTypes) {
    const std::int64_t width = is_block32(type) ? cols : 256;
    const auto w = make_weights(type, rows, width, random_bits(type));
    for (const float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      auto xs = random_floats(static_cast<std::size_t>(width), 1.0f);
      xs[3] = bad;
      Int8RowBuffer buffer;
      buffer.resize(1, width);
      buffer.quantize_row(0, xs.data());
      for (const Int8Path path : supported_int8_paths()) {
        INFO(gguf::tensor_type_name(type) << " on " << int8_path_name(path) << " with " << bad);
        std::vector<float> out(rows, 0.0f);
        int8_matmul_on(path, type, buffer.rows(), 1, w.bytes.data(), w.row_bytes, rows, out.data(),
                       rows);
        for (const float v : out) CHECK(std::isnan(v));
      }
    }
  }
}

TEST_CASE("an int8 matmul row is bit-identical alone and in a batch on every path", "[cpu][int8]") {
  const std::int64_t rows = 69, batch = 32;  // odd: every tile's one-row tail runs
  for (const TensorType type : kTypes) {
    for (const std::int64_t cols : widths(type, {512}, {896})) {
      const auto w = make_weights(type, rows, cols, random_bits(type));
      const auto xs = random_floats(static_cast<std::size_t>(batch * cols), 1.0f);
      Int8RowBuffer all;
      all.resize(batch, cols);
      for (std::int64_t t = 0; t < batch; ++t) all.quantize_row(t, xs.data() + t * cols);
      for (const Int8Path path : supported_int8_paths()) {
        INFO(gguf::tensor_type_name(type)
             << " on " << int8_path_name(path) << ", " << cols << " columns");
        std::vector<float> together(static_cast<std::size_t>(batch * rows));
        int8_matmul_on(path, type, all.rows(), batch, w.bytes.data(), w.row_bytes, rows,
                       together.data(), rows);
        for (const std::int64_t t : {0, 3, 17, 31}) {
          Int8RowBuffer one;
          one.resize(1, cols);
          one.quantize_row(0, xs.data() + t * cols);
          std::vector<float> alone(static_cast<std::size_t>(rows));
          // Weight rows split at an odd place too, as the thread pool's tasks split them.
          int8_matmul_on(path, type, one.rows(), 1, w.bytes.data(), w.row_bytes, 5, alone.data(),
                         rows);
          int8_matmul_on(path, type, one.rows(), 1, w.bytes.data() + 5 * w.row_bytes, w.row_bytes,
                         rows - 5, alone.data() + 5, rows);
          REQUIRE(std::memcmp(alone.data(), together.data() + t * rows, rows * sizeof(float)) == 0);
        }
        // Batches that leave two or three rows past the tiles of four (an expert's few rows).
        for (const std::int64_t n : {2, 3, 6, 7}) {
          INFO(n << " rows");
          std::vector<float> few(static_cast<std::size_t>(n * rows));
          int8_matmul_on(path, type, all.rows().from_row(batch - n), n, w.bytes.data(), w.row_bytes,
                         rows, few.data(), rows);
          REQUIRE(std::memcmp(few.data(), together.data() + (batch - n) * rows,
                              few.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("the CPU backend multiplies quantized weights through the int8 kernels", "[cpu][int8]") {
  CpuBackend backend(2);
  const std::int64_t n = 3, rows = 20;
  for (const TensorType type : kTypes) {
    for (const std::int64_t cols : widths(type, {256}, {896})) {
      INFO(gguf::tensor_type_name(type) << ", " << cols << " columns");
      REQUIRE(has_int8_kernel(type, cols));
      const auto w = make_weights(type, rows, cols, random_bits(type));
      const auto xs = random_floats(static_cast<std::size_t>(n * cols), 1.0f);
      auto x = *backend.allocate(n, cols);
      auto out = *backend.allocate(n, rows);
      std::copy(xs.begin(), xs.end(), x.data);
      backend.matmul(x, model::Weight{w.bytes.data(), type, rows, cols}, out);
      Int8RowBuffer buffer;
      buffer.resize(n, cols);
      for (std::int64_t t = 0; t < n; ++t) buffer.quantize_row(t, xs.data() + t * cols);
      std::vector<float> want(static_cast<std::size_t>(n * rows));
      int8_matmul(type, buffer.rows(), n, w.bytes.data(), w.row_bytes, rows, want.data(), rows);
      const bool same = std::memcmp(out.data, want.data(), want.size() * sizeof(float)) == 0;
      backend.release(x);
      backend.release(out);
      REQUIRE(same);
    }
  }
  REQUIRE_THAT(backend.describe(), Catch::Contains(std::string(int8_path_name(best_int8_path()))));
}

TEST_CASE("only K-quant rows of whole super-blocks have an int8 kernel", "[cpu][int8]") {
  CHECK(has_int8_kernel(TensorType::q5_0, 896));
  CHECK(has_int8_kernel(TensorType::q4_1, 32));
  CHECK(has_int8_kernel(TensorType::iq4_nl, 896));
  CHECK(has_int8_kernel(TensorType::mxfp4, 2880));  // gpt-oss's expert width
  CHECK_FALSE(has_int8_kernel(TensorType::q5_1, 48));
  CHECK_FALSE(has_int8_kernel(TensorType::q4_k, 896));
  CHECK_FALSE(has_int8_kernel(TensorType::q2_k, 896));
  CHECK_FALSE(has_int8_kernel(TensorType::iq4_xs, 896));
  CHECK(has_int8_kernel(TensorType::q3_k, 512));
  CHECK_FALSE(has_int8_kernel(TensorType::f16, 256));
  CHECK_FALSE(has_int8_kernel(TensorType::iq2_xxs, 256));
}
