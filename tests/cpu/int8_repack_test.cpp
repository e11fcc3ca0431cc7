// The repacked int8 kernel (every repacked type, in groups of 16 interleaved rows): bit for
// bit what the scalar reference computes, within rounding of a double-precision product of
// the scalar decoder's weights and the activations as quantized, and a row's result the same
// alone, in any batch and in any split of the weight rows.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "cpu/int8_matmul.hpp"
#include "cpu/int8_repack.hpp"
#include "gguf/dequantize.hpp"
#include "support/int8_weights.hpp"

using namespace troupe;
using namespace troupe::cpu;
using gguf::TensorType;
using test::random_floats;
using test::Weights;

namespace {

const TensorType kTypes[] = {
    TensorType::q8_0,   TensorType::q4_0,  TensorType::q4_1, TensorType::q5_0, TensorType::q5_1,
    TensorType::iq4_nl, TensorType::mxfp4, TensorType::q4_k, TensorType::q5_k, TensorType::iq4_xs,
    TensorType::q6_k,   TensorType::q2_k,  TensorType::q3_k};

// Encoded, with every byte but the scales randomised where the type has bits the encoder
// would not write (support/int8_weights.hpp).
Weights make_weights(TensorType type, std::int64_t rows, std::int64_t cols) {
  return test::make_weights(type, rows, cols, test::random_bits(type));
}

RepackedWeight repack(const Weights& w, TensorType type, std::int64_t rows, std::int64_t cols) {
  RepackedWeight packed = allocate_repacked(type, rows, cols);
  for (std::int64_t g = 0; g < packed.groups; ++g)
    repack_group(packed, w.bytes.data(), w.row_bytes, g);
  return packed;
}

Int8RowBuffer quantized(const std::vector<float>& xs, std::int64_t n, std::int64_t cols) {
  Int8RowBuffer buffer;
  buffer.resize(n, cols);
  for (std::int64_t t = 0; t < n; ++t) buffer.quantize_row(t, xs.data() + t * cols);
  return buffer;
}

// The paths to test the type's kernel on: those this processor runs it on, or the scalar
// reference's stand-in (Int8Path::portable) where none.
std::vector<Int8Path> paths_or_reference(TensorType type) {
  std::vector<Int8Path> paths = repacked_paths(type);
  if (paths.empty()) paths.push_back(Int8Path::portable);
  return paths;
}

std::vector<std::int64_t> widths(TensorType type) {
  if (repack_layout(type).unit_values == 32) return {32, 96, 256, 800};
  return {256, 768};
}

}  // namespace

TEST_CASE("rows of whole units of every quantized type have a repacked layout, floats none",
          "[cpu][int8]") {
  CHECK(can_repack(TensorType::q8_0, 32));
  CHECK(can_repack(TensorType::q4_0, 96));
  CHECK_FALSE(can_repack(TensorType::q8_0, 48));
  CHECK(can_repack(TensorType::q4_k, 512));
  CHECK_FALSE(can_repack(TensorType::q4_k, 288));
  CHECK(can_repack(TensorType::q6_k, 256));
  CHECK(can_repack(TensorType::q5_k, 256));
  CHECK(can_repack(TensorType::iq4_xs, 256));
  CHECK(can_repack(TensorType::q5_1, 32));
  CHECK(can_repack(TensorType::q3_k, 256));
  CHECK_FALSE(can_repack(TensorType::q3_k, 128));
  CHECK(can_repack(TensorType::mxfp4, 256));
  CHECK(can_repack(TensorType::q2_k, 256));
  CHECK_FALSE(can_repack(TensorType::f32, 256));
  CHECK_FALSE(can_repack(TensorType::f16, 256));
  // The layout keeps the file's bits: a group of 16 rows is 16 rows' bytes (Q4_K: with its
  // 6-bit scales a byte each).
  CHECK(repack_layout(TensorType::q8_0).unit_bytes == 16 * 34);
  CHECK(repack_layout(TensorType::q4_0).unit_bytes == 16 * 18);
  CHECK(repack_layout(TensorType::q6_k).unit_bytes == 16 * 210);
  CHECK(repack_layout(TensorType::q5_0).unit_bytes == 16 * 22);
  CHECK(repack_layout(TensorType::q4_k).unit_bytes == 16 * 144 + 64);
  CHECK(repack_layout(TensorType::q5_k).unit_bytes == 16 * 176 + 64);
  // MXFP4: its E8M0 scale as float32 (outside F16's range at either end), nibbles as stored.
  CHECK(repack_layout(TensorType::mxfp4).unit_bytes == 16 * 4 + 256);
  // Q2_K as stored (its 4-bit scales and minimums stay a byte per pair); Q3_K with its 6-bit
  // scales a byte each.
  CHECK(repack_layout(TensorType::q2_k).unit_bytes == 16 * 84);
  CHECK(repack_layout(TensorType::q3_k).unit_bytes == 16 * 114);
}

TEST_CASE("the repacked kernel equals its scalar reference bit for bit and the decoder's product",
          "[cpu][int8]") {
  for (const TensorType type : kTypes) {
    for (const std::int64_t cols : widths(type)) {
      // 37 rows: two whole groups and one of five; 1, 3, 8 and 11 activation rows: every
      // tile height and a remainder.
      for (const std::int64_t n : {1, 3, 8, 11}) {
        const std::int64_t rows = 37;
        INFO(gguf::tensor_type_name(type) << ", " << n << " x " << rows << " x " << cols);
        const auto w = make_weights(type, rows, cols);
        const RepackedWeight packed = repack(w, type, rows, cols);
        const auto xs = random_floats(static_cast<std::size_t>(n * cols), 1.0f);
        const Int8RowBuffer buffer = quantized(xs, n, cols);
        const Int8Rows x = buffer.rows();
        const float nan = std::numeric_limits<float>::quiet_NaN();
        // A wider stride than the rows: nothing is written past a group's last real row.
        const std::int64_t stride = rows + 3;
        std::vector<float> want(static_cast<std::size_t>(n * stride), nan);
        repacked_matmul_reference(packed, x, n, 0, packed.groups, want.data(), stride);
        // Every path this processor runs the type on (none: the reference alone).
        for (const Int8Path path : paths_or_reference(type)) {
          INFO("on " << int8_path_name(path));
          std::vector<float> got(want.size(), nan);
          repacked_matmul_on(path, packed, x, n, 0, packed.groups, got.data(), stride);
          for (std::int64_t t = 0; t < n; ++t) {
            for (std::int64_t r = 0; r < stride; ++r) {
              const float g = got[t * stride + r];
              INFO("row " << t << ", weight row " << r << ": got " << g << ", reference "
                          << want[t * stride + r]);
              if (r >= rows) {
                REQUIRE(std::isnan(g));
                continue;
              }
              REQUIRE(std::memcmp(&g, &want[t * stride + r], sizeof g) == 0);
              double exact = 0.0, magnitude = 0.0;
              for (std::int64_t k = 0; k < cols; ++k) {
                const double xq =
                    static_cast<double>(x.q[t * cols + k]) * x.lane_scales[(t * cols + k) / 4];
                const double p = xq * w.decoded[r * cols + k];
                exact += p;
                magnitude += std::fabs(p);
              }
              REQUIRE(std::fabs(g - exact) <= 2e-6 * magnitude + 1e-6);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("a repacked matmul row is bit-identical alone and in a batch and in any split of groups",
          "[cpu][int8]") {
  const std::int64_t rows = 69, batch = 21;
  for (const TensorType type : kTypes) {
    const std::int64_t cols = 512;
    INFO(gguf::tensor_type_name(type));
    const auto w = make_weights(type, rows, cols);
    const RepackedWeight packed = repack(w, type, rows, cols);
    const auto xs = random_floats(static_cast<std::size_t>(batch * cols), 1.0f);
    const Int8RowBuffer all = quantized(xs, batch, cols);
    for (const Int8Path path : paths_or_reference(type)) {
      INFO("on " << int8_path_name(path));
      const auto product = [&](const Int8Rows& x, std::int64_t n, std::int64_t g0, std::int64_t g1,
                               float* out) {
        repacked_matmul_on(path, packed, x, n, g0, g1, out, rows);
      };
      std::vector<float> together(static_cast<std::size_t>(batch * rows));
      product(all.rows(), batch, 0, packed.groups, together.data());
      for (const std::int64_t t : {0, 7, 8, 20}) {
        const Int8RowBuffer one = quantized(
            std::vector<float>(xs.begin() + t * cols, xs.begin() + (t + 1) * cols), 1, cols);
        std::vector<float> alone(static_cast<std::size_t>(rows));
        // The groups in two calls, as the thread pool's tasks split them.
        product(one.rows(), 1, 0, 2, alone.data());
        product(one.rows(), 1, 2, packed.groups, alone.data());
        REQUIRE(std::memcmp(alone.data(), together.data() + t * rows, rows * sizeof(float)) == 0);
      }
      for (const std::int64_t n : {2, 5, 9}) {
        INFO(n << " rows from row " << batch - n);
        std::vector<float> few(static_cast<std::size_t>(n * rows));
        product(all.rows().from_row(batch - n), n, 0, packed.groups, few.data());
        REQUIRE(std::memcmp(few.data(), together.data() + (batch - n) * rows,
                            few.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("a NaN activation gives NaN products through the repacked kernel", "[cpu][int8]") {
  for (const TensorType type : kTypes) {
    INFO(gguf::tensor_type_name(type));
    const std::int64_t rows = 16, cols = 256;
    const auto w = make_weights(type, rows, cols);
    const RepackedWeight packed = repack(w, type, rows, cols);
    auto xs = random_floats(static_cast<std::size_t>(2 * cols), 1.0f);
    xs[cols + 77] = std::numeric_limits<float>::quiet_NaN();
    const Int8RowBuffer buffer = quantized(xs, 2, cols);
    for (const Int8Path path : paths_or_reference(type)) {
      INFO("on " << int8_path_name(path));
      std::vector<float> out(static_cast<std::size_t>(2 * rows));
      repacked_matmul_on(path, packed, buffer.rows(), 2, 0, 1, out.data(), rows);
      for (std::int64_t r = 0; r < rows; ++r) {
        REQUIRE(std::isfinite(out[r]));
        REQUIRE(std::isnan(out[rows + r]));
      }
    }
  }
}

TEST_CASE("the CPU backend multiplies the quantized matrices it loaded through their repacked rows",
          "[cpu][int8]") {
  CpuBackend backend(2);
  const std::int64_t rows = 40, cols = 256;
  for (const TensorType type : kTypes) {
    INFO(gguf::tensor_type_name(type));
    const auto w = make_weights(type, rows, cols);
    const gguf::GgufTensorInfo info = test::matrix_info(type, rows, cols, w.bytes);
    const model::Weight weight = *backend.load_weight(info);
    for (const std::int64_t n : {1, 6}) {
      const auto xs = random_floats(static_cast<std::size_t>(n * cols), 1.0f);
      auto x = *backend.allocate(n, cols);
      auto out = *backend.allocate(n, rows);
      std::copy(xs.begin(), xs.end(), x.data);
      backend.matmul(x, weight, out);
      const Int8RowBuffer buffer = quantized(xs, n, cols);
      std::vector<float> want(static_cast<std::size_t>(n * rows));
      if (repacked_kernel_available(type)) {
        const RepackedWeight packed = repack(w, type, rows, cols);
        repacked_matmul_reference(packed, buffer.rows(), n, 0, packed.groups, want.data(), rows);
      } else {  // this processor keeps the file's layout
        int8_matmul(type, buffer.rows(), n, w.bytes.data(), w.row_bytes, rows, want.data(), rows);
      }
      const bool same = std::memcmp(out.data, want.data(), want.size() * sizeof(float)) == 0;
      backend.release(x);
      backend.release(out);
      REQUIRE(same);
    }
  }
}

TEST_CASE("MXFP4 scales at both ends of E8M0's range give the reference's bits", "[cpu][int8]") {
  // 2^-128 and 2^-127 (the subnormal halves), 2^-20, 2^10 and 2^100: an F16 scale could hold
  // only the middle two.
  const std::int64_t rows = 16, cols = 64;
  auto w = make_weights(TensorType::mxfp4, rows, cols);
  const std::uint8_t exponents[] = {0, 1, 108, 138, 228};
  const std::size_t block_bytes = 17;
  for (std::size_t b = 0; b * block_bytes < w.bytes.size(); ++b) {
    w.bytes[b * block_bytes] = static_cast<std::byte>(exponents[b % 5]);
  }
  const RepackedWeight packed = repack(w, TensorType::mxfp4, rows, cols);
  const auto xs = random_floats(static_cast<std::size_t>(3 * cols), 1.0f);
  const Int8RowBuffer buffer = quantized(xs, 3, cols);
  std::vector<float> want(static_cast<std::size_t>(3 * rows));
  repacked_matmul_reference(packed, buffer.rows(), 3, 0, 1, want.data(), rows);
  for (const Int8Path path : paths_or_reference(TensorType::mxfp4)) {
    INFO("path " << int8_path_name(path));
    std::vector<float> got(want.size(), -1.0f);
    repacked_matmul_on(path, packed, buffer.rows(), 3, 0, 1, got.data(), rows);
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("output " << i << ": " << got[i] << " against " << want[i]);
      CHECK(std::memcmp(&got[i], &want[i], sizeof(float)) == 0);
    }
  }
  // The scales reach the products: the outputs are far from F16's range.
  bool large = false;
  for (const float v : want) large = large || std::fabs(v) > 1e20f;
  CHECK(large);
}
