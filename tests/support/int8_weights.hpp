// Quantized weights and activations for the int8 kernels' tests (int8_matmul_test,
// int8_repack_test): random rows encoded by troupe's quantizer, with every byte but the
// scales randomised where a type has bits the encoder would not write, and decoded again by
// the scalar decoder as the tests' reference; and the tensor info the backend loads a matrix
// from (float_panels_test too).
#pragma once

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gguf/dequantize.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/tensor_type.hpp"

namespace troupe::test {

using gguf::TensorType;

// What the GGUF reader gives for a rows x cols matrix of `type` in `bytes` (an FFN matrix's
// name, so the backend treats it as a matrix to repack).
inline gguf::GgufTensorInfo matrix_info(TensorType type, std::int64_t rows, std::int64_t cols,
                                        const std::vector<std::byte>& bytes) {
  gguf::GgufTensorInfo info;
  info.name = "blk.0.ffn_up.weight";
  info.type = type;
  info.num_dims = 2;
  info.dims[0] = cols;
  info.dims[1] = rows;
  info.num_bytes = bytes.size();
  info.data = bytes.data();
  return info;
}

inline std::mt19937& rng() {
  static std::mt19937 generator(20261202);
  return generator;
}

inline std::vector<float> random_floats(std::size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng());
  return v;
}

struct Weights {
  std::vector<std::byte> bytes;
  std::vector<float> decoded;  // [rows, cols], by the scalar decoder
  std::size_t row_bytes = 0;
};

// The scale fields of a block, [begin, end): d and dmin (Q4_K, Q5_K, Q2_K), d (Q6_K, Q3_K,
// Q5_0, IQ4_NL, IQ4_XS), d and m (Q4_1, Q5_1), the exponent byte (MXFP4).
inline std::pair<std::size_t, std::size_t> f16_fields(TensorType type) {
  switch (type) {
    case TensorType::q6_k:
      return {208, 210};
    case TensorType::q2_k:
      return {80, 84};
    case TensorType::q3_k:
      return {108, 110};
    case TensorType::q5_0:
    case TensorType::iq4_nl:
    case TensorType::iq4_xs:
      return {0, 2};
    case TensorType::mxfp4:
      return {0, 1};
    default:
      return {0, 4};
  }
}

// Encoded by troupe's quantizer, then every byte but the f16 fields randomised (all but Q8_0
// and Q4_0), so that all 6-bit scales, minimums and high bits occur (not only what the
// encoder happens to write).
inline Weights make_weights(TensorType type, std::int64_t rows, std::int64_t cols,
                            bool random_bits) {
  Weights w;
  w.bytes = *gguf::quantize(type, random_floats(static_cast<std::size_t>(rows * cols), 0.5f), cols);
  w.row_bytes = gguf::row_bytes(type, cols);
  if (random_bits) {
    const auto traits = *gguf::tensor_type_traits(static_cast<std::uint32_t>(type));
    std::uniform_int_distribution<int> byte(0, 255);
    for (std::size_t b = 0; b < w.bytes.size(); b += traits.block_bytes) {
      // The encoder's scales stay: finite and small.
      const auto [keep_begin, keep_end] = f16_fields(type);
      for (std::size_t i = 0; i < traits.block_bytes; ++i) {
        if (i < keep_begin || i >= keep_end) w.bytes[b + i] = static_cast<std::byte>(byte(rng()));
      }
    }
  }
  w.decoded.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    REQUIRE(gguf::dequantize_row(type, w.bytes.data() + r * w.row_bytes, cols,
                                 w.decoded.data() + r * cols)
                .has_value());
  }
  return w;
}

inline bool random_bits(TensorType type) {
  return type != TensorType::q8_0 && type != TensorType::q4_0;
}

}  // namespace troupe::test
