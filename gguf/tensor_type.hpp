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
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
  nvfp4 = 40,
  q1_0 = 41,
  q2_0 = 42,
};

struct TensorTypeTraits {
  std::string_view name;
  std::size_t block_elements;  // elements per block (1 for plain types)
  std::size_t block_bytes;     // bytes per block
};

// The traits of a type id ggml defines (names and block sizes of every one, whether troupe
// computes with it or not), or nothing for an id ggml does not define.
std::optional<TensorTypeTraits> tensor_type_traits(std::uint32_t type_id);

// The name of an id ggml once defined and has removed from GGUF files (Q4_0_4_4 and the other
// interleaved layouts, now repacked at load time), or nothing.
std::optional<std::string_view> removed_tensor_type_name(std::uint32_t type_id);

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

// IQ4_NL and IQ4_XS: each 4-bit index selects one of these 16 non-linear levels (ggml's
// kvalues_iq4nl), times the block's scale.
inline constexpr std::int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                 1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4: the 16 FP4 (E2M1) values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, doubled
// to integers as ggml stores them (kvalues_mxfp4); the block's scale is halved to match.
inline constexpr std::int8_t kMxfp4Values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                                 0, -1, -2, -3, -4, -6, -8, -12};

}  // namespace troupe::gguf
