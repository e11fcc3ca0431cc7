#include "cpu/int8_matmul.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/kernels.hpp"
#include "gguf/half.hpp"

#include "troupe/result.hpp"

namespace troupe::cpu {

// One definition per instruction set, in int8_matmul_<isa>.cpp.
#define TROUPE_DECLARE_INT8_PATH(ns)                                                            \
  namespace ns {                                                                                \
  void int8_matmul(gguf::TensorType type, const Int8Rows& x, std::int64_t num_x,                \
                   const std::byte* w, std::size_t w_row_bytes, std::int64_t num_w, float* out, \
                   std::int64_t out_stride);                                                    \
  }
TROUPE_DECLARE_INT8_PATH(int8_portable)
#if defined(__x86_64__) && defined(TROUPE_INT8_X86)
TROUPE_DECLARE_INT8_PATH(int8_avx2)
TROUPE_DECLARE_INT8_PATH(int8_avx_vnni)
TROUPE_DECLARE_INT8_PATH(int8_avx512)
#endif
#undef TROUPE_DECLARE_INT8_PATH

namespace {

std::vector<Int8Path> detect_paths() {
  std::vector<Int8Path> paths{Int8Path::portable};
#if defined(__x86_64__) && defined(TROUPE_INT8_X86)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (avx2) paths.push_back(Int8Path::avx2);
  if (avx2 && __builtin_cpu_supports("avxvnni")) paths.push_back(Int8Path::avx_vnni);
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512vnni")) {
    paths.push_back(Int8Path::avx512_vnni);
  }
#endif
  return paths;
}

const std::vector<Int8Path>& paths() {
  static const std::vector<Int8Path> detected = detect_paths();
  return detected;
}

}  // namespace

void Int8RowBuffer::resize(std::int64_t rows, std::int64_t cols) {
  TROUPE_ASSERT(cols % 32 == 0, "int8 activations come in blocks of 32");
  cols_ = cols;
  q_.resize(static_cast<std::size_t>(rows * cols));
  lane_scales_.resize(static_cast<std::size_t>(rows * cols / 4));
  sums_.resize(static_cast<std::size_t>(rows * cols / 16));
  int_sums_.resize(static_cast<std::size_t>(rows * cols / 16));
}

void Int8RowBuffer::quantize_row(std::int64_t r, const float* x) {
  quantize_row_int8(x, cols_, q_.data() + r * cols_, lane_scales_.data() + r * (cols_ / 4),
                    sums_.data() + r * (cols_ / 16), int_sums_.data() + r * (cols_ / 16));
}

float int8_tail_dot(gguf::TensorType type, const std::byte* w_row, const std::int8_t* q,
                    const float* lane_scales, std::int64_t cols) {
  const Block32Layout layout = block32_layout(type);
  const bool q8 = type == gguf::TensorType::q8_0;
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(w_row);
  float sum = 0.0f;
  for (std::int64_t b = cols / 256 * 8; b < cols / 32; ++b) {
    const std::uint8_t* block = bytes + b * layout.bytes;
    const std::uint8_t* quants = block + layout.quants;
    std::uint32_t high_bits = 0;
    if (layout.high_bits != 0) std::memcpy(&high_bits, block + layout.high_bits, 4);
    const std::int8_t* xq = q + b * 32;
    std::int32_t dot = 0, sum_q = 0;
    for (int i = 0; i < 32; ++i) {
      const int nibble = i < 16 ? quants[i] & 0xF : quants[i - 16] >> 4;
      const int wv = q8 ? static_cast<std::int8_t>(quants[i])
                     : layout.table
                         ? layout.table[nibble]
                         : (nibble | static_cast<int>((high_bits >> i) & 1u) << 4) - layout.offset;
      dot += wv * xq[i];
      sum_q += xq[i];
    }
    std::uint16_t bits;
    std::memcpy(&bits, block, 2);
    const float d = layout.e8m0 ? gguf::e8m0_half_to_f32(block[0]) : gguf::f16_to_f32(bits);
    const float scale = lane_scales[b * 8];
    sum += d * scale * static_cast<float>(dot);
    if (layout.min != 0) {
      std::memcpy(&bits, block + layout.min, 2);
      sum += gguf::f16_to_f32(bits) * scale * static_cast<float>(sum_q);
    }
  }
  return sum;
}

std::string_view int8_path_name(Int8Path path) {
  switch (path) {
    case Int8Path::portable:
      return "portable";
    case Int8Path::avx2:
      return "AVX2";
    case Int8Path::avx_vnni:
      return "AVX-VNNI";
    case Int8Path::avx512_vnni:
      return "AVX-512 VNNI";
  }
  return "unknown";
}

std::span<const Int8Path> supported_int8_paths() {
  return paths();
}

Int8Path best_int8_path() {
  return paths().back();
}

bool int8_path_supported(Int8Path path) {
  return std::find(paths().begin(), paths().end(), path) != paths().end();
}

bool has_int8_kernel(gguf::TensorType type, std::int64_t cols) {
  using gguf::TensorType;
  switch (type) {
    case TensorType::q8_0:
    case TensorType::q4_0:
    case TensorType::q4_1:
    case TensorType::q5_0:
    case TensorType::q5_1:
    case TensorType::iq4_nl:
    case TensorType::mxfp4:
      return cols % 32 == 0;
    case TensorType::q2_k:
    case TensorType::q3_k:
    case TensorType::q4_k:
    case TensorType::q5_k:
    case TensorType::q6_k:
    case TensorType::iq4_xs:
      return cols % 256 == 0;
    default:
      return false;
  }
}

void int8_matmul_on(Int8Path path, gguf::TensorType type, const Int8Rows& x, std::int64_t num_x,
                    const std::byte* w, std::size_t w_row_bytes, std::int64_t num_w, float* out,
                    std::int64_t out_stride) {
  TROUPE_ASSERT(has_int8_kernel(type, x.cols), "int8_matmul on a type without an int8 kernel");
  TROUPE_ASSERT(int8_path_supported(path), "int8_matmul on a path this processor cannot run");
  switch (path) {
#if defined(__x86_64__) && defined(TROUPE_INT8_X86)
    case Int8Path::avx512_vnni:
      return int8_avx512::int8_matmul(type, x, num_x, w, w_row_bytes, num_w, out, out_stride);
    case Int8Path::avx_vnni:
      return int8_avx_vnni::int8_matmul(type, x, num_x, w, w_row_bytes, num_w, out, out_stride);
    case Int8Path::avx2:
      return int8_avx2::int8_matmul(type, x, num_x, w, w_row_bytes, num_w, out, out_stride);
#endif
    default:
      return int8_portable::int8_matmul(type, x, num_x, w, w_row_bytes, num_w, out, out_stride);
  }
}

void int8_matmul(gguf::TensorType type, const Int8Rows& x, std::int64_t num_x, const std::byte* w,
                 std::size_t w_row_bytes, std::int64_t num_w, float* out, std::int64_t out_stride) {
  static const Int8Path best = best_int8_path();
  int8_matmul_on(best, type, x, num_x, w, w_row_bytes, num_w, out, out_stride);
}

}  // namespace troupe::cpu
