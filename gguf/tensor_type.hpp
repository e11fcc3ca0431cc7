// ggml's tensor element types as stored in GGUF files: ids, block sizes, names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe::gguf {

// The numeric ids are ggml's (they are what GGUF files store).
enum class TensorType : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  bf16 = 30,
};

struct TensorTypeTraits {
  std::string_view name;
  std::size_t block_elements;  // elements per block (1 for plain types)
  std::size_t block_bytes;     // bytes per block
};

// The traits of a known type id, or nothing for an id this reader does not know.
std::optional<TensorTypeTraits> tensor_type_traits(std::uint32_t type_id);

inline std::string_view tensor_type_name(TensorType type) {
  auto traits = tensor_type_traits(static_cast<std::uint32_t>(type));
  return traits ? traits->name : std::string_view("unknown");
}

// Q8_0: 32 weights as int8 with one f16 scale.
struct BlockQ8_0 {
  std::uint16_t d;  // f16 scale
  std::int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_0: 32 weights as 4-bit values (offset 8) with one f16 scale; element j of
// the block is the low nibble of qs[j] for j < 16 and the high nibble of qs[j-16].
struct BlockQ4_0 {
  std::uint16_t d;  // f16 scale
  std::uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18);

}  // namespace troupe::gguf
