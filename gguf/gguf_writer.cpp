#include "gguf/gguf_writer.hpp"

#include <cstdio>
#include <cstring>
#include <memory>

namespace troupe::gguf {

namespace {

constexpr std::uint64_t kAlignment = 32;

// resize + memcpy rather than insert: GCC 12 warns falsely about insert of a few bytes.
void put_bytes(std::vector<std::byte>& out, const void* data, std::size_t size) {
  if (size == 0) return;
  const std::size_t at = out.size();
  out.resize(at + size);
  std::memcpy(out.data() + at, data, size);
}

template <typename T>
void put(std::vector<std::byte>& out, const T& value) {
  put_bytes(out, &value, sizeof(T));
}

void put_string(std::vector<std::byte>& out, std::string_view text) {
  put<std::uint64_t>(out, text.size());
  put_bytes(out, text.data(), text.size());
}

void pad_to(std::vector<std::byte>& out, std::uint64_t alignment) {
  while (out.size() % alignment != 0) out.push_back(std::byte{0});
}

void put_value(std::vector<std::byte>& out, const GgufValue& value) {
  switch (value.type) {
    case GgufType::u8:
      put<std::uint8_t>(out, static_cast<std::uint8_t>(std::get<std::uint64_t>(value.value)));
      break;
    case GgufType::u16:
      put<std::uint16_t>(out, static_cast<std::uint16_t>(std::get<std::uint64_t>(value.value)));
      break;
    case GgufType::u32:
      put<std::uint32_t>(out, static_cast<std::uint32_t>(std::get<std::uint64_t>(value.value)));
      break;
    case GgufType::u64:
      put<std::uint64_t>(out, std::get<std::uint64_t>(value.value));
      break;
    case GgufType::i8:
      put<std::int8_t>(out, static_cast<std::int8_t>(std::get<std::int64_t>(value.value)));
      break;
    case GgufType::i16:
      put<std::int16_t>(out, static_cast<std::int16_t>(std::get<std::int64_t>(value.value)));
      break;
    case GgufType::i32:
      put<std::int32_t>(out, static_cast<std::int32_t>(std::get<std::int64_t>(value.value)));
      break;
    case GgufType::i64:
      put<std::int64_t>(out, std::get<std::int64_t>(value.value));
      break;
    case GgufType::f32:
      put<float>(out, static_cast<float>(std::get<double>(value.value)));
      break;
    case GgufType::f64:
      put<double>(out, std::get<double>(value.value));
      break;
    case GgufType::boolean:
      put<std::uint8_t>(out, std::get<bool>(value.value) ? 1 : 0);
      break;
    case GgufType::string:
      put_string(out, std::get<std::string_view>(value.value));
      break;
    case GgufType::array: {
      const auto& array = std::get<GgufArray>(value.value);
      put<std::uint32_t>(out, static_cast<std::uint32_t>(array.element_type));
      put<std::uint64_t>(out, array.elements.size());
      for (const auto& e : array.elements) put_value(out, e);
      break;
    }
  }
}

}  // namespace

void GgufWriter::add_value(std::string_view key, const GgufValue& value) {
  begin_entry(key, static_cast<std::uint32_t>(value.type));
  put_value(metadata_, value);
}

void GgufWriter::begin_entry(std::string_view key, std::uint32_t type_id) {
  put_string(metadata_, key);
  put<std::uint32_t>(metadata_, type_id);
  ++num_metadata_;
}

void GgufWriter::add_uint32(std::string_view key, std::uint32_t value) {
  begin_entry(key, 4);
  put(metadata_, value);
}

void GgufWriter::add_int32(std::string_view key, std::int32_t value) {
  begin_entry(key, 5);
  put(metadata_, value);
}

void GgufWriter::add_uint64(std::string_view key, std::uint64_t value) {
  begin_entry(key, 10);
  put(metadata_, value);
}

void GgufWriter::add_float32(std::string_view key, float value) {
  begin_entry(key, 6);
  put(metadata_, value);
}

void GgufWriter::add_bool(std::string_view key, bool value) {
  begin_entry(key, 7);
  put<std::uint8_t>(metadata_, value ? 1 : 0);
}

void GgufWriter::add_string(std::string_view key, std::string_view value) {
  begin_entry(key, 8);
  put_string(metadata_, value);
}

void GgufWriter::add_string_array(std::string_view key, std::span<const std::string> values) {
  begin_entry(key, 9);
  put<std::uint32_t>(metadata_, 8);
  put<std::uint64_t>(metadata_, values.size());
  for (const auto& v : values) put_string(metadata_, v);
}

void GgufWriter::add_float32_array(std::string_view key, std::span<const float> values) {
  begin_entry(key, 9);
  put<std::uint32_t>(metadata_, 6);
  put<std::uint64_t>(metadata_, values.size());
  for (float v : values) put(metadata_, v);
}

void GgufWriter::add_int32_array(std::string_view key, std::span<const std::int32_t> values) {
  begin_entry(key, 9);
  put<std::uint32_t>(metadata_, 5);
  put<std::uint64_t>(metadata_, values.size());
  for (std::int32_t v : values) put(metadata_, v);
}

void GgufWriter::add_raw(std::string_view key, std::uint32_t type_id,
                         std::span<const std::byte> encoded) {
  begin_entry(key, type_id);
  put_bytes(metadata_, encoded.data(), encoded.size());
}

void GgufWriter::add_tensor(std::string_view name, TensorType type, std::vector<std::int64_t> dims,
                            std::vector<std::byte> data) {
  tensors_.push_back(Tensor{std::string(name), type, std::move(dims), std::move(data)});
}

std::vector<std::byte> GgufWriter::to_bytes() const {
  std::vector<std::byte> out;
  put<std::uint32_t>(out, 0x46554747);
  put<std::uint32_t>(out, 3);
  put<std::uint64_t>(out, tensors_.size());
  put<std::uint64_t>(out, num_metadata_);
  put_bytes(out, metadata_.data(), metadata_.size());
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(out, t.name);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) put<std::uint64_t>(out, static_cast<std::uint64_t>(d));
    put<std::uint32_t>(out, static_cast<std::uint32_t>(t.type));
    put<std::uint64_t>(out, offset);
    offset += (t.data.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  pad_to(out, kAlignment);
  for (const auto& t : tensors_) {
    put_bytes(out, t.data.data(), t.data.size());
    pad_to(out, kAlignment);
  }
  return out;
}

Result<void> GgufWriter::write(const std::string& path) const {
  const auto bytes = to_bytes();
  const std::string tmp = path + ".partial";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (!f) {
    return make_error(ErrorCode::io, "cannot write '" + tmp + "': " + std::strerror(errno));
  }
  if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size() ||
      std::fflush(f.get()) != 0) {
    return make_error(ErrorCode::io, "short write to '" + tmp + "': " + std::strerror(errno));
  }
  f.reset();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return make_error(ErrorCode::io,
                      "cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  }
  return {};
}

}  // namespace troupe::gguf
