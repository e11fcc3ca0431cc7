// A memory-mapped GGUF (v2, v3) file: its metadata and its tensor infos, all
// validated against the mapping, so nothing read through it leaves the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "gguf/tensor_type.hpp"
#include "troupe/result.hpp"

namespace troupe::gguf {

// GGUF's metadata value type ids.
enum class GgufType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

std::string_view gguf_type_name(GgufType type);

struct GgufValue;

struct GgufArray {
  GgufType element_type = GgufType::u8;
  std::vector<GgufValue> elements;
};

// One metadata value. Strings view the mapping; integers keep their signedness.
struct GgufValue {
  GgufType type = GgufType::u8;
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string_view, GgufArray> value;
};

struct GgufTensorInfo {
  std::string name;
  TensorType type = TensorType::f32;
  std::uint32_t num_dims = 0;
  std::int64_t dims[4] = {1, 1, 1, 1};  // ggml order: dims[0] is the contiguous one
  std::uint64_t offset = 0;             // from the start of the data section
  std::uint64_t num_bytes = 0;
  const std::byte* data = nullptr;  // inside the mapping, num_bytes long

  std::int64_t num_elements() const { return dims[0] * dims[1] * dims[2] * dims[3]; }
};

// Keeps the bytes alive: an mmap of a file, or an owned buffer.
class GgufStorage;

class GgufFile {
 public:
  // Maps and parses a file read-only.
  static Result<GgufFile> open(const std::string& path);
  // Parses a copy of bytes already in memory (tests, generated models).
  static Result<GgufFile> parse(std::span<const std::byte> bytes);

  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::size_t file_size() const;

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // Typed accessors: the error names the key and what was wrong with it.
  Result<std::uint64_t> get_uint(std::string_view key) const;
  Result<std::int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string_view> get_string(std::string_view key) const;
  Result<const GgufArray*> get_array(std::string_view key, GgufType element_type) const;

 private:
  static Result<GgufFile> parse_storage(std::shared_ptr<GgufStorage> storage);

  std::shared_ptr<GgufStorage> storage_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::unordered_map<std::string, std::size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, std::size_t> tensor_index_;
};

}  // namespace troupe::gguf
