// What the host and the kernels agree on, with no CUDA header in it.
#pragma once

#include <cstdint>

namespace troupe::gpu::kernels {

// The 16-bit types weights live in on the device.
enum class Half16 : std::int32_t { f16, bf16 };

// A second, 16-bit copy of an op's output: the next matmul's input, cast for free.
struct Copy16 {
  void* data = nullptr;  // none when null
  Half16 type = Half16::bf16;
};

// Keys each decode split covers at most (its shared memory is sized for this); small
// batches split finer (StepLayout::partition, AttentionArgs::partition).
inline constexpr std::int32_t kDecodePartition = 256;
inline constexpr std::int32_t kMaxGroup = 16;  // query heads per KV head
inline constexpr std::int32_t kMaxHeadDim = 256;

// A prefill tile: up to kPrefillTile consecutive rows of one sequence.
inline constexpr std::int32_t kPrefillTile = 16;
struct PrefillTile {
  std::int32_t first_row;
  std::int32_t num_rows;
};

}  // namespace troupe::gpu::kernels
