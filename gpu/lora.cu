// LoRA on the GPU: a step's low-rank updates y[r] += s * B (A x[r]) for the rows of each
// adapter group, gathered by each row's adapter slot (Punica's grouping: one launch pair
// for every adapter of the step, never a pass per adapter). The shrink gives each row a
// block whose warps take A's rows (the rank) and stream x and A in order; the expand gives
// each (row, 256 columns) a block whose threads walk the rank over B^T's coalesced rows.
#include <cuda_fp16.h>

#include "gpu/kernels.hpp"

namespace troupe::gpu::kernels {

namespace {

constexpr int kShrinkThreads = 128;
constexpr int kExpandThreads = 256;

__device__ __forceinline__ float lora_value(const void* p, std::int64_t i, bool f16) {
  return f16 ? __half2float(static_cast<const __half*>(p)[i]) : static_cast<const float*>(p)[i];
}

// The launch's group for this slot, or -1 (the base model, or an adapter that leaves this
// matrix alone).
__device__ __forceinline__ int group_of(const LoraLaunch& l, int slot) {
  for (int g = 0; g < l.num_groups; ++g) {
    if (l.groups[g].slot == slot) return g;
  }
  return -1;
}

// grid (rows): ax[r][k] = A[k] . x[r] for the row's group.
__global__ void __launch_bounds__(kShrinkThreads)
    lora_shrink_kernel(const float* __restrict__ x, const std::int32_t* __restrict__ row_slots,
                       LoraLaunch l, float* __restrict__ ax) {
  const int r = blockIdx.x;
  const int g = group_of(l, row_slots[r]);
  if (g < 0) return;
  const LoraGroupArgs& group = l.groups[g];
  const float* xr = x + static_cast<std::int64_t>(r) * l.n_in;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int k = warp; k < group.rank; k += kShrinkThreads / 32) {
    const std::int64_t row = static_cast<std::int64_t>(k) * l.n_in;
    float acc = 0.0f;
    for (int i = lane; i < l.n_in; i += 32) acc += lora_value(group.a, row + i, group.f16) * xr[i];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) ax[static_cast<std::int64_t>(r) * l.ax_stride + k] = acc;
  }
}

// grid (rows, column blocks): y[r][j] += s * sum_k ax[r][k] B^T[k][j].
__global__ void __launch_bounds__(kExpandThreads)
    lora_expand_kernel(float* __restrict__ y, const std::int32_t* __restrict__ row_slots,
                       LoraLaunch l, const float* __restrict__ ax) {
  const int r = blockIdx.x;
  const int j = blockIdx.y * kExpandThreads + threadIdx.x;
  if (j >= l.n_out) return;
  const int g = group_of(l, row_slots[r]);
  if (g < 0) return;
  const LoraGroupArgs& group = l.groups[g];
  const float* axr = ax + static_cast<std::int64_t>(r) * l.ax_stride;
  float acc = 0.0f;
  for (int k = 0; k < group.rank; ++k) {
    acc += axr[k] * lora_value(group.b_t, static_cast<std::int64_t>(k) * l.n_out + j, group.f16);
  }
  y[static_cast<std::int64_t>(r) * l.n_out + j] += group.scale * acc;
}

}  // namespace

void lora_add(const float* x, float* y, std::int64_t rows, const std::int32_t* row_slots,
              const LoraLaunch& launch, float* ax, cudaStream_t stream) {
  if (rows == 0 || launch.num_groups == 0) return;
  lora_shrink_kernel<<<static_cast<unsigned>(rows), kShrinkThreads, 0, stream>>>(x, row_slots,
                                                                                 launch, ax);
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((launch.n_out + kExpandThreads - 1) / kExpandThreads));
  lora_expand_kernel<<<grid, kExpandThreads, 0, stream>>>(y, row_slots, launch, ax);
}

}  // namespace troupe::gpu::kernels
