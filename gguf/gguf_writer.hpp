// Builds a GGUF v3 file in memory: metadata and tensors, written in one go.
// Used to make random-weight models and the corrupt files the tests feed the reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_file.hpp"
#include "gguf/tensor_type.hpp"
#include "troupe/result.hpp"

namespace troupe::gguf {

class GgufWriter {
 public:
  void add_uint32(std::string_view key, std::uint32_t value);
  void add_int32(std::string_view key, std::int32_t value);
  void add_uint64(std::string_view key, std::uint64_t value);
  void add_float32(std::string_view key, float value);
  void add_bool(std::string_view key, bool value);
  void add_string(std::string_view key, std::string_view value);
  void add_string_array(std::string_view key, std::span<const std::string> values);
  void add_float32_array(std::string_view key, std::span<const float> values);
  void add_int32_array(std::string_view key, std::span<const std::int32_t> values);
  // Copies a value read from another file (any type, nested arrays included).
  void add_value(std::string_view key, const GgufValue& value);
  // Raw encoded value bytes with their GGUF type id: lets tests write any value shape.
  void add_raw(std::string_view key, std::uint32_t type_id, std::span<const std::byte> encoded);

  // dims in ggml order (dims[0] contiguous); data already encoded in `type`.
  void add_tensor(std::string_view name, TensorType type, std::vector<std::int64_t> dims,
                  std::vector<std::byte> data);

  std::vector<std::byte> to_bytes() const;
  Result<void> write(const std::string& path) const;

  std::size_t num_tensors() const { return tensors_.size(); }

 private:
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<std::int64_t> dims;
    std::vector<std::byte> data;
  };
  void begin_entry(std::string_view key, std::uint32_t type_id);

  std::vector<std::byte> metadata_;  // encoded key/value entries
  std::uint64_t num_metadata_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace troupe::gguf
