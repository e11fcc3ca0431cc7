// A model file's F32 matrices rounded to 16 bits, written to a fresh copy: what a GPU test's
// CPU reference loads so that both compute with the very weights the GPU holds.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "gguf/dequantize.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "support/test_support.hpp"

namespace troupe::test {

// A copy of the model file with its F32 matrices stored in `type`, rounded as the GPU
// rounds them on upload, so that the CPU reference computes with the very weights the GPU
// holds: the two then differ only in the GPU's 16-bit activations. Matrices already in
// 16 bits or quantized (the CPU's own int8 kernels are what those tests compare) stay.
inline std::string with_matrices_in(const std::string& path, gguf::TensorType type) {
  auto file = gguf::GgufFile::open(path);
  REQUIRE(file.has_value());
  gguf::GgufWriter writer;
  for (const auto& [key, value] : file->metadata()) writer.add_value(key, value);
  for (const auto& t : file->tensors()) {
    std::vector<std::int64_t> dims(t.dims, t.dims + t.num_dims);
    if (t.dims[1] * t.dims[2] * t.dims[3] == 1 || t.type != gguf::TensorType::f32) {
      writer.add_tensor(t.name, t.type, dims, std::vector<std::byte>(t.data, t.data + t.num_bytes));
      continue;
    }
    const std::int64_t cols = t.dims[0], rows = t.num_elements() / cols;
    std::vector<float> values(static_cast<std::size_t>(rows * cols));
    const std::size_t stride = gguf::row_bytes(t.type, cols);
    for (std::int64_t r = 0; r < rows; ++r) {
      REQUIRE(gguf::dequantize_row(t.type, t.data + r * stride, cols, values.data() + r * cols)
                  .has_value());
    }
    auto encoded = gguf::quantize(type, values, cols);
    REQUIRE(encoded.has_value());
    writer.add_tensor(t.name, type, dims, std::move(*encoded));
  }
  const auto copy =
      test::temp_path(type == gguf::TensorType::bf16 ? "gpu-ref-bf16.gguf" : "gpu-ref-f16.gguf");
  REQUIRE(writer.write(copy).has_value());
  return copy;
}

}  // namespace troupe::test
