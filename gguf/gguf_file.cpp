#include "gguf/gguf_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

namespace troupe::gguf {

class GgufStorage {
 public:
  GgufStorage(const std::byte* data, std::size_t size, void* mapping, std::vector<std::byte> owned)
      : data_(data), size_(size), mapping_(mapping), owned_(std::move(owned)) {}
  ~GgufStorage() {
    if (mapping_ != nullptr) ::munmap(mapping_, size_);
  }
  GgufStorage(const GgufStorage&) = delete;
  GgufStorage& operator=(const GgufStorage&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  const std::byte* data_;
  std::size_t size_;
  void* mapping_;
  std::vector<std::byte> owned_;
};

namespace {

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxArrayDepth = 8;
constexpr std::uint64_t kMaxNameBytes = 1 << 16;

std::string describe(std::string_view what, std::uint64_t offset) {
  return std::string(what) + " at byte " + std::to_string(offset);
}

// A bounds-checked reader over the file's bytes. Every read checks the
// remaining length first, so a truncated or lying file cannot make it read past the end.
class Cursor {
 public:
  explicit Cursor(std::span<const std::byte> bytes) : bytes_(bytes) {}

  std::uint64_t offset() const { return offset_; }
  std::uint64_t remaining() const { return bytes_.size() - offset_; }

  template <typename T>
  Result<T> read(std::string_view what) {
    if (remaining() < sizeof(T)) {
      return make_error(ErrorCode::invalid_file, "truncated file: " + describe(what, offset_) +
                                                     " needs " + std::to_string(sizeof(T)) +
                                                     " bytes, " + std::to_string(remaining()) +
                                                     " remain");
    }
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  Result<std::string_view> read_string(std::string_view what, std::uint64_t max_bytes) {
    const std::uint64_t at = offset_;
    TROUPE_TRY(const auto length, read<std::uint64_t>(what));
    if (length > remaining()) {
      return make_error(ErrorCode::invalid_file, "corrupt file: " + describe(what, at) +
                                                     " claims " + std::to_string(length) +
                                                     " bytes but only " +
                                                     std::to_string(remaining()) + " remain");
    }
    if (length > max_bytes) {
      return make_error(ErrorCode::invalid_file,
                        "corrupt file: " + describe(what, at) + " is " + std::to_string(length) +
                            " bytes long, more than the limit of " + std::to_string(max_bytes));
    }
    std::string_view text(reinterpret_cast<const char*>(bytes_.data() + offset_), length);
    offset_ += length;
    return text;
  }

 private:
  std::span<const std::byte> bytes_;
  std::uint64_t offset_ = 0;
};

// The fewest bytes one value of a type takes in the file; bounds array counts.
std::uint64_t min_value_bytes(GgufType type) {
  switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string:
      return 8;
    case GgufType::array:
      return 12;
  }
  return 1;
}

bool is_known_type(std::uint32_t id) {
  return id <= static_cast<std::uint32_t>(GgufType::f64);
}

Result<GgufValue> read_value(Cursor& cursor, GgufType type, const std::string& key, int depth);

Result<GgufValue> read_array(Cursor& cursor, const std::string& key, int depth) {
  if (depth >= kMaxArrayDepth) {
    return make_error(ErrorCode::invalid_file, "corrupt metadata: key '" + key +
                                                   "' nests arrays deeper than " +
                                                   std::to_string(kMaxArrayDepth) + " levels");
  }
  const std::uint64_t at = cursor.offset();
  TROUPE_TRY(const auto element_id,
             cursor.read<std::uint32_t>("array element type of '" + key + "'"));
  if (!is_known_type(element_id)) {
    return make_error(ErrorCode::invalid_file, "corrupt metadata: key '" + key +
                                                   "' has an array of unknown value type " +
                                                   std::to_string(element_id));
  }
  const auto element_type = static_cast<GgufType>(element_id);
  TROUPE_TRY(const auto count, cursor.read<std::uint64_t>("array length of '" + key + "'"));
  if (count > cursor.remaining() / min_value_bytes(element_type)) {
    return make_error(ErrorCode::invalid_file,
                      "corrupt metadata: key '" + key + "' claims an array of " +
                          std::to_string(count) + " " + std::string(gguf_type_name(element_type)) +
                          " values (" + describe("starting", at) + "), more than the file holds");
  }
  GgufArray array;
  array.element_type = element_type;
  array.elements.reserve(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    TROUPE_TRY(auto element, read_value(cursor, element_type, key, depth + 1));
    array.elements.push_back(std::move(element));
  }
  return GgufValue{GgufType::array, std::move(array)};
}

Result<GgufValue> read_value(Cursor& cursor, GgufType type, const std::string& key, int depth) {
  const std::string what = "value of '" + key + "'";
  switch (type) {
    case GgufType::u8: {
      TROUPE_TRY(const auto v, cursor.read<std::uint8_t>(what));
      return GgufValue{type, std::uint64_t{v}};
    }
    case GgufType::u16: {
      TROUPE_TRY(const auto v, cursor.read<std::uint16_t>(what));
      return GgufValue{type, std::uint64_t{v}};
    }
    case GgufType::u32: {
      TROUPE_TRY(const auto v, cursor.read<std::uint32_t>(what));
      return GgufValue{type, std::uint64_t{v}};
    }
    case GgufType::u64: {
      TROUPE_TRY(const auto v, cursor.read<std::uint64_t>(what));
      return GgufValue{type, std::uint64_t{v}};
    }
    case GgufType::i8: {
      TROUPE_TRY(const auto v, cursor.read<std::int8_t>(what));
      return GgufValue{type, std::int64_t{v}};
    }
    case GgufType::i16: {
      TROUPE_TRY(const auto v, cursor.read<std::int16_t>(what));
      return GgufValue{type, std::int64_t{v}};
    }
    case GgufType::i32: {
      TROUPE_TRY(const auto v, cursor.read<std::int32_t>(what));
      return GgufValue{type, std::int64_t{v}};
    }
    case GgufType::i64: {
      TROUPE_TRY(const auto v, cursor.read<std::int64_t>(what));
      return GgufValue{type, std::int64_t{v}};
    }
    case GgufType::f32: {
      TROUPE_TRY(const auto v, cursor.read<float>(what));
      return GgufValue{type, double{v}};
    }
    case GgufType::f64: {
      TROUPE_TRY(const auto v, cursor.read<double>(what));
      return GgufValue{type, v};
    }
    case GgufType::boolean: {
      TROUPE_TRY(const auto v, cursor.read<std::uint8_t>(what));
      if (v > 1) {
        return make_error(
            ErrorCode::invalid_file,
            "corrupt metadata: key '" + key + "' holds a bool of value " + std::to_string(v));
      }
      return GgufValue{type, v == 1};
    }
    case GgufType::string: {
      TROUPE_TRY(const auto v, cursor.read_string(what, std::numeric_limits<std::uint64_t>::max()));
      return GgufValue{type, v};
    }
    case GgufType::array:
      return read_array(cursor, key, depth);
  }
  return make_error(ErrorCode::invalid_file,
                    "corrupt metadata: key '" + key + "' has unknown type");
}

Result<std::shared_ptr<GgufStorage>> map_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer forever; it is
  // refused below as what it is. A regular file reads as it would without it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return make_error(ErrorCode::io,
                      "cannot open model file '" + path + "': " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(ErrorCode::io, "cannot stat '" + path + "': " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::io, "'" + path + "' is not a regular file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return make_error(ErrorCode::invalid_file, "'" + path + "' is empty, not a GGUF file");
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (mapping == MAP_FAILED) {
    return make_error(ErrorCode::io, "cannot map '" + path + "': " + std::strerror(err));
  }
  return std::make_shared<GgufStorage>(static_cast<const std::byte*>(mapping), size, mapping,
                                       std::vector<std::byte>{});
}

}  // namespace

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::u8:
      return "uint8";
    case GgufType::i8:
      return "int8";
    case GgufType::u16:
      return "uint16";
    case GgufType::i16:
      return "int16";
    case GgufType::u32:
      return "uint32";
    case GgufType::i32:
      return "int32";
    case GgufType::f32:
      return "float32";
    case GgufType::boolean:
      return "bool";
    case GgufType::string:
      return "string";
    case GgufType::array:
      return "array";
    case GgufType::u64:
      return "uint64";
    case GgufType::i64:
      return "int64";
    case GgufType::f64:
      return "float64";
  }
  return "unknown";
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  TROUPE_TRY(auto storage, map_file(path));
  auto file = parse_storage(std::move(storage));
  if (!file) file.error().message = path + ": " + file.error().message;
  return file;
}

Result<GgufFile> GgufFile::parse(std::span<const std::byte> bytes) {
  std::vector<std::byte> owned(bytes.begin(), bytes.end());
  const std::byte* data = owned.data();
  const std::size_t size = owned.size();
  return parse_storage(std::make_shared<GgufStorage>(data, size, nullptr, std::move(owned)));
}

std::size_t GgufFile::file_size() const {
  return storage_->bytes().size();
}

Result<GgufFile> GgufFile::parse_storage(std::shared_ptr<GgufStorage> storage) {
  GgufFile file;
  file.storage_ = storage;
  const auto bytes = storage->bytes();
  Cursor cursor(bytes);

  TROUPE_TRY(const auto magic, cursor.read<std::uint32_t>("magic"));
  if (magic != kMagic) {
    return make_error(ErrorCode::invalid_file,
                      "not a GGUF file: the first four bytes are not 'GGUF'");
  }
  TROUPE_TRY(file.version_, cursor.read<std::uint32_t>("version"));
  if (file.version_ != 2 && file.version_ != 3) {
    const bool swapped = file.version_ == 0x02000000 || file.version_ == 0x03000000;
    return make_error(ErrorCode::unsupported,
                      swapped ? std::string("big-endian GGUF files are not supported")
                              : "unsupported GGUF version " + std::to_string(file.version_) +
                                    " (versions 2 and 3 are)");
  }
  TROUPE_TRY(const auto num_tensors, cursor.read<std::uint64_t>("tensor count"));
  TROUPE_TRY(const auto num_metadata, cursor.read<std::uint64_t>("metadata count"));
  // A tensor info takes at least 8 (name) + 4 (dims) + 8 (dim) + 4 (type) + 8 (offset) bytes,
  // a metadata entry at least 8 (key) + 4 (type) + 1 (value).
  if (num_tensors > cursor.remaining() / 32) {
    return make_error(ErrorCode::invalid_file, "corrupt header: tensor count " +
                                                   std::to_string(num_tensors) +
                                                   " is more than the file can hold");
  }
  if (num_metadata > cursor.remaining() / 13) {
    return make_error(ErrorCode::invalid_file, "corrupt header: metadata count " +
                                                   std::to_string(num_metadata) +
                                                   " is more than the file can hold");
  }

  file.metadata_.reserve(num_metadata);
  for (std::uint64_t i = 0; i < num_metadata; ++i) {
    TROUPE_TRY(const auto key_view,
               cursor.read_string("key of metadata entry " + std::to_string(i), kMaxNameBytes));
    std::string key(key_view);
    if (key.empty()) {
      return make_error(ErrorCode::invalid_file,
                        "corrupt metadata: entry " + std::to_string(i) + " has an empty key");
    }
    TROUPE_TRY(const auto type_id, cursor.read<std::uint32_t>("value type of '" + key + "'"));
    if (!is_known_type(type_id)) {
      return make_error(
          ErrorCode::invalid_file,
          "corrupt metadata: key '" + key + "' has unknown value type " + std::to_string(type_id));
    }
    TROUPE_TRY(auto value, read_value(cursor, static_cast<GgufType>(type_id), key, 0));
    if (!file.metadata_index_.emplace(key, file.metadata_.size()).second) {
      return make_error(ErrorCode::invalid_file,
                        "corrupt metadata: key '" + key + "' appears twice");
    }
    file.metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const GgufValue* alignment = file.find("general.alignment")) {
    const auto* value = std::get_if<std::uint64_t>(&alignment->value);
    if (value == nullptr || *value == 0 || (*value & (*value - 1)) != 0 || *value > (1u << 20)) {
      return make_error(ErrorCode::invalid_file,
                        "corrupt metadata: 'general.alignment' must be a power of two up to 1 MiB");
    }
    file.alignment_ = *value;
  }

  file.tensors_.reserve(num_tensors);
  for (std::uint64_t i = 0; i < num_tensors; ++i) {
    GgufTensorInfo info;
    TROUPE_TRY(const auto name,
               cursor.read_string("name of tensor " + std::to_string(i), kMaxNameBytes));
    info.name = std::string(name);
    const std::string where = "tensor '" + info.name + "'";
    TROUPE_TRY(info.num_dims, cursor.read<std::uint32_t>("dimension count of " + where));
    if (info.num_dims == 0 || info.num_dims > 4) {
      return make_error(ErrorCode::invalid_file, "corrupt " + where + ": " +
                                                     std::to_string(info.num_dims) +
                                                     " dimensions (1 to 4 are allowed)");
    }
    std::uint64_t num_elements = 1;
    for (std::uint32_t d = 0; d < info.num_dims; ++d) {
      TROUPE_TRY(const auto dim, cursor.read<std::uint64_t>("dimension of " + where));
      if (dim == 0 || dim > (std::uint64_t{1} << 40) ||
          num_elements > std::numeric_limits<std::int64_t>::max() / dim) {
        return make_error(
            ErrorCode::invalid_file,
            "corrupt " + where + ": dimension " + std::to_string(d) + " is " + std::to_string(dim));
      }
      info.dims[d] = static_cast<std::int64_t>(dim);
      num_elements *= dim;
    }
    TROUPE_TRY(const auto type_id, cursor.read<std::uint32_t>("type of " + where));
    const auto traits = tensor_type_traits(type_id);
    if (!traits) {
      // Every type ggml defines has traits (the model loader refuses, naming the tensor and
      // its type, what troupe cannot compute with); what is left has no known block size.
      if (const auto removed = removed_tensor_type_name(type_id)) {
        return make_error(ErrorCode::unsupported,
                          where + " has tensor type " + std::string(*removed) + " (" +
                              std::to_string(type_id) +
                              "), which ggml has removed from GGUF files; convert the model again");
      }
      return make_error(ErrorCode::unsupported,
                        where + " has unknown tensor type " + std::to_string(type_id));
    }
    info.type = static_cast<TensorType>(type_id);
    if (info.dims[0] % static_cast<std::int64_t>(traits->block_elements) != 0) {
      return make_error(ErrorCode::invalid_file,
                        "corrupt " + where + ": its row of " + std::to_string(info.dims[0]) +
                            " elements is not a whole number of " + std::string(traits->name) +
                            " blocks of " + std::to_string(traits->block_elements));
    }
    info.num_bytes = num_elements / traits->block_elements * traits->block_bytes;
    TROUPE_TRY(info.offset, cursor.read<std::uint64_t>("data offset of " + where));
    if (info.offset % file.alignment_ != 0) {
      return make_error(ErrorCode::invalid_file,
                        "corrupt " + where + ": data offset " + std::to_string(info.offset) +
                            " is not aligned to " + std::to_string(file.alignment_));
    }
    if (!file.tensor_index_.emplace(info.name, file.tensors_.size()).second) {
      return make_error(ErrorCode::invalid_file, "corrupt file: " + where + " appears twice");
    }
    file.tensors_.push_back(std::move(info));
  }

  const std::uint64_t data_start =
      (cursor.offset() + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  for (auto& info : file.tensors_) {
    const std::uint64_t available = data_start <= bytes.size() ? bytes.size() - data_start : 0;
    if (info.offset > available || info.num_bytes > available - info.offset) {
      return make_error(ErrorCode::invalid_file,
                        "truncated or corrupt file: tensor '" + info.name + "' (" +
                            std::to_string(info.num_bytes) + " bytes at data offset " +
                            std::to_string(info.offset) + ") lies outside the file of " +
                            std::to_string(bytes.size()) + " bytes");
    }
    info.data = bytes.data() + data_start + info.offset;
  }
  return file;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = metadata_index_.find(std::string(key));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Error missing(std::string_view key) {
  return Error{ErrorCode::invalid_file, "missing metadata key '" + std::string(key) + "'"};
}

Error wrong_type(std::string_view key, const GgufValue& value, std::string_view wanted) {
  return Error{ErrorCode::invalid_file, "metadata key '" + std::string(key) + "' is " +
                                            std::string(gguf_type_name(value.type)) + ", not " +
                                            std::string(wanted)};
}

}  // namespace

Result<std::uint64_t> GgufFile::get_uint(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return tl::unexpected(missing(key));
  if (const auto* u = std::get_if<std::uint64_t>(&value->value)) return *u;
  if (const auto* i = std::get_if<std::int64_t>(&value->value); i != nullptr && *i >= 0) {
    return static_cast<std::uint64_t>(*i);
  }
  return tl::unexpected(wrong_type(key, *value, "a non-negative integer"));
}

Result<std::int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return tl::unexpected(missing(key));
  if (const auto* i = std::get_if<std::int64_t>(&value->value)) return *i;
  if (const auto* u = std::get_if<std::uint64_t>(&value->value);
      u != nullptr && *u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(*u);
  }
  return tl::unexpected(wrong_type(key, *value, "an integer"));
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return tl::unexpected(missing(key));
  if (const auto* d = std::get_if<double>(&value->value)) return *d;
  if (const auto* u = std::get_if<std::uint64_t>(&value->value)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<std::int64_t>(&value->value)) return static_cast<double>(*i);
  return tl::unexpected(wrong_type(key, *value, "a number"));
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return tl::unexpected(missing(key));
  if (const auto* b = std::get_if<bool>(&value->value)) return *b;
  return tl::unexpected(wrong_type(key, *value, "a bool"));
}

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return tl::unexpected(missing(key));
  if (const auto* s = std::get_if<std::string_view>(&value->value)) return *s;
  return tl::unexpected(wrong_type(key, *value, "a string"));
}

Result<const GgufArray*> GgufFile::get_array(std::string_view key, GgufType element_type) const {
  const GgufValue* value = find(key);
  if (value == nullptr) return tl::unexpected(missing(key));
  const auto* array = std::get_if<GgufArray>(&value->value);
  if (array == nullptr) return tl::unexpected(wrong_type(key, *value, "an array"));
  if (array->element_type != element_type) {
    return make_error(ErrorCode::invalid_file,
                      "metadata key '" + std::string(key) + "' is an array of " +
                          std::string(gguf_type_name(array->element_type)) + ", not of " +
                          std::string(gguf_type_name(element_type)));
  }
  return array;
}

}  // namespace troupe::gguf
