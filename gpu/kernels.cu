// Elementwise and row kernels: casts, embedding, RMSNorm (with the residual add
// fused), RoPE, KV stores, SwiGLU, row gathers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "gpu/kernels.hpp"
#include "gpu/random.cuh"

namespace troupe::gpu::kernels {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(std::int64_t n, int threads = kThreads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
}

__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float uniform_pm1(std::uint64_t seed, std::uint64_t i) {
  const std::uint64_t r = mix64(seed ^ mix64(i));
  return static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <typename T>
__global__ void cast_kernel(const float* __restrict__ x, T* __restrict__ y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    y[i] = from_float<T>(x[i]);
  }
}

template <typename T>
__global__ void fill_random_kernel(T* y, std::int64_t n, std::uint64_t seed, float scale,
                                   float offset) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    y[i] = from_float<T>(scale * uniform_pm1(seed, static_cast<std::uint64_t>(i)) + offset);
  }
}

__global__ void fill_random_f32_kernel(float* y, std::int64_t n, std::uint64_t seed, float scale,
                                       float offset) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    y[i] = scale * uniform_pm1(seed, static_cast<std::uint64_t>(i)) + offset;
  }
}

template <typename T>
__global__ void embed_kernel(const std::int32_t* __restrict__ tokens, const T* __restrict__ table,
                             std::int64_t cols, float* __restrict__ out) {
  const std::int64_t row = blockIdx.x;
  const T* src = table + static_cast<std::int64_t>(tokens[row]) * cols;
  float* dst = out + row * cols;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = to_float(src[c]);
}

// Sum over the block; every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = (blockDim.x + 31) / 32;
  float total = 0.0f;
  for (int w = 0; w < num_warps; ++w) total += partial[w];
  return total;
}

__device__ __forceinline__ void store16(Copy16 copy, std::int64_t i, float v) {
  if (copy.type == Half16::f16) {
    static_cast<__half*>(copy.data)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(copy.data)[i] = __float2bfloat16_rn(v);
  }
}

// One block per row. With `y`, x += y first (the residual add fused in); with a copy, the
// output is also written in 16 bits for the matmul that reads it next.
__global__ void rms_norm_kernel(float* x, const float* __restrict__ y, const float* __restrict__ w,
                                float eps, float* out, std::int64_t cols, Copy16 copy) {
  float* xr = x + blockIdx.x * cols;
  const float* yr = y != nullptr ? y + blockIdx.x * cols : nullptr;
  float* outr = out + blockIdx.x * cols;
  float sum = 0.0f;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = xr[c];
    if (yr != nullptr) {
      v += yr[c];
      xr[c] = v;
    }
    sum += v * v;
  }
  const float scale = rsqrtf(block_sum(sum) / static_cast<float>(cols) + eps);
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = xr[c] * scale * w[c];
    outr[c] = v;
    if (copy.data != nullptr) store16(copy, blockIdx.x * cols + c, v);
  }
}

// A key or value as the F16 cache keeps it: beyond F16's range, the largest finite half of
// its sign (an infinite key would make its attention row NaN); NaN stays NaN. The CPU's
// gguf::f32_to_f16_saturated is the same rule.
__device__ __forceinline__ __half kv_half(float x) {
  return __float2half_rn(isnan(x) ? x : fminf(fmaxf(x, -65504.0f), 65504.0f));
}

// grid (rows, parts): each block computes its row's angles into shared memory, then takes
// every parts-th stretch of q's pairs, k's pairs (rotated in place and into the cache), k's
// unrotated dims and v into the cache. A row is spread over several blocks because one
// block per row left a batch-1 decode step latency-bound: 20 dependent rounds of loads for
// Llama-3-8B's 40 heads, 15 us a layer on an H200 (ncu), now one or two.
__global__ void rope_store_kv_kernel(float* q, float* k, const float* __restrict__ v,
                                     const std::int32_t* __restrict__ positions,
                                     const std::int32_t* __restrict__ slots, RopeArgs a,
                                     std::int32_t num_kv_heads, __half* __restrict__ k_cache,
                                     __half* __restrict__ v_cache) {
  __shared__ float cos_s[kMaxHeadDim / 2], sin_s[kMaxHeadDim / 2];
  const std::int64_t row = blockIdx.x;
  const std::int32_t half = a.rot_dims / 2;
  for (std::int32_t pair = threadIdx.x; pair < half; pair += blockDim.x) {
    float theta = static_cast<float>(positions[row]);
    for (std::int32_t i = 0; i < pair; ++i) theta *= a.theta_scale;
    theta = a.freq_scale * (theta / (a.freq_factors != nullptr ? a.freq_factors[pair] : 1.0f));
    sincosf(theta, &sin_s[pair], &cos_s[pair]);
  }
  __syncthreads();
  const std::int32_t slot = slots != nullptr ? slots[row] : -1;
  const std::int32_t kv_dim = num_kv_heads * a.head_dim;
  const std::int64_t cache_row = static_cast<std::int64_t>(slot) * kv_dim;
  float* qr = q != nullptr ? q + row * a.num_heads * a.head_dim : nullptr;
  float* kr = k + row * kv_dim;
  const float* vr = v + row * kv_dim;
  const std::int32_t first = blockIdx.y * blockDim.x + threadIdx.x;
  const std::int32_t stride = gridDim.y * blockDim.x;
  for (std::int32_t i = first; i < (a.num_heads + num_kv_heads) * half; i += stride) {
    const bool is_q = i < a.num_heads * half;
    const std::int32_t j = is_q ? i : i - a.num_heads * half;
    const std::int32_t head = j / half, pair = j % half;
    float* x = (is_q ? qr : kr) + head * a.head_dim;
    const std::int32_t ia = a.neox ? pair : 2 * pair;
    const std::int32_t ib = a.neox ? pair + half : 2 * pair + 1;
    const float c = cos_s[pair], s = sin_s[pair];
    const float x0 = x[ia], x1 = x[ib];
    const float y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
    x[ia] = y0;
    x[ib] = y1;
    if (!is_q && slot >= 0) {
      k_cache[cache_row + head * a.head_dim + ia] = kv_half(y0);
      k_cache[cache_row + head * a.head_dim + ib] = kv_half(y1);
    }
  }
  if (slot < 0) return;
  for (std::int32_t e = first; e < kv_dim; e += stride) {
    if (e % a.head_dim >= a.rot_dims) k_cache[cache_row + e] = kv_half(kr[e]);
    v_cache[cache_row + e] = kv_half(vr[e]);
  }
}

__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                              float* out, std::int64_t n, Copy16 copy) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    const float v = g / (1.0f + __expf(-g)) * up[i];
    out[i] = v;
    if (copy.data != nullptr) store16(copy, i, v);
  }
}

__global__ void add_kernel(float* x, const float* __restrict__ y, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void add_bias_kernel(float* x, const float* __restrict__ bias, std::int64_t n,
                                std::int64_t cols) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    x[i] += bias[i % cols];
  }
}

__global__ void gelu_tanh_gate_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* out, std::int64_t n, Copy16 copy) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    const float v = 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
    out[i] = v;
    if (copy.data != nullptr) store16(copy, i, v);
  }
}

__global__ void scale_kernel(float* x, float factor, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    x[i] *= factor;
  }
}

__global__ void softcap_kernel(float* x, float cap, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    x[i] = cap * tanhf(x[i] / cap);
  }
}

__global__ void gather_rows_kernel(const float* __restrict__ x,
                                   const std::int32_t* __restrict__ rows, float* __restrict__ out,
                                   std::int64_t cols) {
  const float* src = x + static_cast<std::int64_t>(rows[blockIdx.x]) * cols;
  float* dst = out + blockIdx.x * cols;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
}

__global__ void fill_nan_kernel(float* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    x[i] = __int_as_float(0x7fc00000);
  }
}

int row_threads(std::int64_t cols) {
  if (cols >= 1024) return 1024;
  if (cols >= 256) return 256;
  return 64;
}

}  // namespace

void cast_to_16(const float* x, void* y, Half16 type, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (type == Half16::f16) {
    cast_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, static_cast<__half*>(y), n);
  } else {
    cast_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, static_cast<__nv_bfloat16*>(y), n);
  }
}

void fill_random_16(void* y, Half16 type, std::int64_t n, std::uint64_t seed, float scale,
                    cudaStream_t stream) {
  if (n == 0) return;
  if (type == Half16::f16) {
    fill_random_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<__half*>(y), n, seed,
                                                             scale, 0.0f);
  } else {
    fill_random_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(y), n,
                                                             seed, scale, 0.0f);
  }
}

void fill_random_f32(float* y, std::int64_t n, std::uint64_t seed, float scale, float offset,
                     cudaStream_t stream) {
  if (n == 0) return;
  fill_random_f32_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, n, seed, scale, offset);
}

void embed(const std::int32_t* tokens, const void* table, Half16 type, std::int64_t cols,
           float* out, std::int64_t rows, cudaStream_t stream) {
  if (rows == 0) return;
  const auto grid = static_cast<unsigned>(rows);
  if (type == Half16::f16) {
    embed_kernel<<<grid, row_threads(cols), 0, stream>>>(tokens, static_cast<const __half*>(table),
                                                         cols, out);
  } else {
    embed_kernel<<<grid, row_threads(cols), 0, stream>>>(
        tokens, static_cast<const __nv_bfloat16*>(table), cols, out);
  }
}

void rms_norm(const float* x, const float* w, float eps, float* out, std::int64_t rows,
              std::int64_t cols, Copy16 copy, cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), row_threads(cols), 0, stream>>>(
      const_cast<float*>(x), nullptr, w, eps, out, cols, copy);
}

void add_rms_norm(float* x, const float* y, const float* w, float eps, float* out,
                  std::int64_t rows, std::int64_t cols, Copy16 copy, cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), row_threads(cols), 0, stream>>>(x, y, w, eps, out,
                                                                                 cols, copy);
}

void rope_store_kv(float* q, float* k, const float* v, const std::int32_t* positions,
                   const std::int32_t* slots, std::int64_t rows, const RopeArgs& args,
                   std::int32_t num_kv_heads, void* k_cache, void* v_cache, cudaStream_t stream) {
  if (rows == 0) return;
  // Enough blocks a row that each thread rotates about one pair; past 64 rows the rows alone
  // fill the device, and more parts would only recompute the angles.
  constexpr std::int64_t kThreadsPerPart = 128;
  const std::int64_t pairs = std::int64_t{args.num_heads + num_kv_heads} * (args.rot_dims / 2);
  const std::int64_t wanted = (pairs + kThreadsPerPart - 1) / kThreadsPerPart;
  const auto parts =
      static_cast<unsigned>(std::clamp<std::int64_t>(rows >= 64 ? 1 : wanted, 1, 32));
  rope_store_kv_kernel<<<dim3(static_cast<unsigned>(rows), parts), kThreadsPerPart, 0, stream>>>(
      q, k, v, positions, slots, args, num_kv_heads, static_cast<__half*>(k_cache),
      static_cast<__half*>(v_cache));
}

void swiglu(const float* gate, const float* up, float* out, std::int64_t n, Copy16 copy,
            cudaStream_t stream) {
  if (n == 0) return;
  swiglu_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, out, n, copy);
}

void add(float* x, const float* y, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
}

void add_bias(float* x, const float* bias, std::int64_t rows, std::int64_t cols,
              cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n == 0) return;
  add_bias_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, bias, n, cols);
}

void gelu_tanh_gate(const float* gate, const float* up, float* out, std::int64_t n, Copy16 copy,
                    cudaStream_t stream) {
  if (n == 0) return;
  gelu_tanh_gate_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, out, n, copy);
}

void scale(float* x, float factor, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, factor, n);
}

void softcap(float* x, float cap, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  softcap_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, cap, n);
}

void gather_rows(const float* x, const std::int32_t* rows, float* out, std::int64_t num_rows,
                 std::int64_t cols, cudaStream_t stream) {
  if (num_rows == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(num_rows), row_threads(cols), 0, stream>>>(x, rows,
                                                                                        out, cols);
}

void fill_nan(float* x, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  fill_nan_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n);
}

}  // namespace troupe::gpu::kernels
