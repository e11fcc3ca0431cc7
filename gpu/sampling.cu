// Sampling on the device: one block per row of logits. Greedy is an argmax.
// Otherwise the kept set is every token whose probability (relative to the most
// likely one, at the row's temperature) reaches a threshold: the k-th largest
// (top-k), min_p, and the smallest top set holding top_p of what top-k kept.
// Thresholds are found by radix selection over the probabilities' float bits
// (positive floats order as their bits do), so nothing is sorted; the draw is an
// inverse-CDF scan in token order with a counter-based uniform.
#include <cmath>
#include <cstdint>

#include "gpu/kernels.hpp"
#include "gpu/random.cuh"

namespace troupe::gpu::kernels {

namespace {

constexpr int kThreads = 512;  // 1024 would cap registers at 32 and spill
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;

// The relative probability exp((x - max) / T) in [0, 1]; NaN logits count as impossible.
__device__ __forceinline__ float weight(float x, float max, float inverse_temperature) {
  return x == x ? __expf((x - max) * inverse_temperature) : 0.0f;
}

struct Shared {
  float values[kWarps];
  std::int32_t indices[kWarps];
  float bin_mass[kBins];
  std::int32_t bin_count[kBins];
  std::uint32_t selected;
  float remaining;
  float carry;
  std::int32_t found;
};

__device__ float block_sum(float v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.values[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += sh.values[w];  // the same order in every thread
  return total;
}

__device__ std::int32_t block_min_index(std::int32_t i, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) i = min(i, __shfl_xor_sync(0xffffffffu, i, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.indices[threadIdx.x / 32] = i;
  __syncthreads();
  std::int32_t best = sh.indices[0];
  for (int w = 1; w < kWarps; ++w) best = min(best, sh.indices[w]);
  return best;
}

// The largest key K such that the kept tokens with key >= K number at least `count`
// (by_mass false) or weigh at least `target` (by_mass true).
__device__ std::uint32_t radix_select(const float* x, std::int32_t vocab, float max,
                                      float inverse_temperature, bool by_mass, float target,
                                      Shared& sh) {
  std::uint32_t prefix = 0, mask = 0;
  if (threadIdx.x == 0) sh.remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.bin_mass[b] = 0.0f;
      sh.bin_count[b] = 0;
    }
    __syncthreads();
    for (std::int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float w = weight(x[i], max, inverse_temperature);
      const std::uint32_t key = __float_as_uint(w);
      if ((key & mask) == prefix && w > 0.0f) {
        const int bin = static_cast<int>((key >> shift) & 0xffu);
        atomicAdd(&sh.bin_count[bin], 1);
        if (by_mass) atomicAdd(&sh.bin_mass[bin], w);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float cumulative = 0.0f;
      int selected = -1, lowest_nonempty = 0;
      for (int b = kBins - 1; b >= 0; --b) {
        if (sh.bin_count[b] == 0) continue;
        lowest_nonempty = b;
        const float here = by_mass ? sh.bin_mass[b] : static_cast<float>(sh.bin_count[b]);
        if (cumulative + here >= sh.remaining) {
          selected = b;
          break;
        }
        cumulative += here;
      }
      // Rounding can leave the target just out of reach: the lowest bin then holds the cut.
      if (selected < 0) selected = lowest_nonempty;
      sh.selected = static_cast<std::uint32_t>(selected);
      sh.remaining -= cumulative;
    }
    __syncthreads();
    prefix |= sh.selected << shift;
    mask |= 0xffu << shift;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, std::int32_t vocab,
                  const SamplingRowArgs* __restrict__ params, std::int32_t* __restrict__ ids) {
  __shared__ Shared sh;
  const float* x = logits + static_cast<std::int64_t>(blockIdx.x) * vocab;
  const SamplingRowArgs p = params[blockIdx.x];

  // The most likely token (lowest id among equals): greedy's answer, and the softmax's max.
  float best = -INFINITY;
  std::int32_t best_id = vocab;
  for (std::int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x[i];
    if (v > best) {  // NaN never compares greater
      best = v;
      best_id = i;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, best, o);
    const std::int32_t other_id = __shfl_xor_sync(0xffffffffu, best_id, o);
    if (other > best || (other == best && other_id < best_id)) {
      best = other;
      best_id = other_id;
    }
  }
  if (threadIdx.x % 32 == 0) {
    sh.values[threadIdx.x / 32] = best;
    sh.indices[threadIdx.x / 32] = best_id;
  }
  __syncthreads();
  best = sh.values[0];
  best_id = sh.indices[0];
  for (int w = 1; w < kWarps; ++w) {
    if (sh.values[w] > best || (sh.values[w] == best && sh.indices[w] < best_id)) {
      best = sh.values[w];
      best_id = sh.indices[w];
    }
  }
  if (best_id >= vocab) best_id = 0;  // every logit NaN or -inf: nothing better to say
  if (p.temperature <= 0.0f || best == -INFINITY) {
    if (threadIdx.x == 0) ids[blockIdx.x] = best_id;
    return;
  }
  const float inverse_temperature = 1.0f / p.temperature;

  std::uint32_t threshold = 0;
  if (p.top_k > 0 && p.top_k < vocab) {
    threshold =
        radix_select(x, vocab, best, inverse_temperature, false, static_cast<float>(p.top_k), sh);
  }
  if (p.min_p > 0.0f) threshold = max(threshold, __float_as_uint(p.min_p));
  if (p.top_p < 1.0f) {
    float kept = 0.0f;
    for (std::int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float w = weight(x[i], best, inverse_temperature);
      if (__float_as_uint(w) >= threshold) kept += w;
    }
    kept = block_sum(kept, sh);
    const std::uint32_t top_p_threshold =
        radix_select(x, vocab, best, inverse_temperature, true, p.top_p * kept, sh);
    threshold = max(threshold, top_p_threshold);
  }
  // The most likely token always stays (its weight is 1, and every threshold is <= 1).
  threshold = min(threshold, __float_as_uint(1.0f));

  float total = 0.0f;
  for (std::int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float w = weight(x[i], best, inverse_temperature);
    if (w > 0.0f && __float_as_uint(w) >= threshold) total += w;
  }
  total = block_sum(total, sh);
  const std::uint64_t r = mix64(p.seed ^ mix64(p.counter + 0x632BE59BD9B4E019ull));
  const float u =
      static_cast<float>(static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0)) * total;

  // Inverse CDF in token order: a block-wide scan per chunk of kThreads tokens.
  if (threadIdx.x == 0) {
    sh.carry = 0.0f;
    sh.found = vocab;
  }
  std::int32_t last_kept = -1;
  for (std::int32_t base = 0; base < vocab; base += kThreads) {
    const std::int32_t i = base + static_cast<std::int32_t>(threadIdx.x);
    float w = 0.0f;
    if (i < vocab) {
      w = weight(x[i], best, inverse_temperature);
      if (!(w > 0.0f && __float_as_uint(w) >= threshold)) w = 0.0f;
    }
    if (w > 0.0f) last_kept = i;
    float inclusive = w;  // warp scan
    for (int o = 1; o < 32; o <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (threadIdx.x % 32 >= o) inclusive += up;
    }
    __syncthreads();
    if (threadIdx.x % 32 == 31) sh.values[threadIdx.x / 32] = inclusive;
    __syncthreads();
    float before = sh.carry;
    for (int wi = 0; wi < static_cast<int>(threadIdx.x / 32); ++wi) before += sh.values[wi];
    const bool crosses = w > 0.0f && before + inclusive > u;
    const std::int32_t first = block_min_index(crosses ? i : vocab, sh);
    if (first < vocab) {
      if (threadIdx.x == 0) sh.found = first;
      break;
    }
    if (threadIdx.x == kThreads - 1) sh.carry = before + inclusive;
    __syncthreads();
  }
  __syncthreads();
  // Past the end by rounding: the last kept token.
  if (sh.found >= vocab) {
    for (int o = 16; o > 0; o >>= 1)
      last_kept = max(last_kept, __shfl_xor_sync(0xffffffffu, last_kept, o));
    __syncthreads();
    if (threadIdx.x % 32 == 0) sh.indices[threadIdx.x / 32] = last_kept;
    __syncthreads();
    if (threadIdx.x == 0) {
      std::int32_t last = best_id;
      for (int w = 0; w < kWarps; ++w) last = max(last, sh.indices[w]);
      ids[blockIdx.x] = last;
    }
    return;
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = sh.found;
}

// A grammar's bitmask: every token whose bit is clear becomes impossible (-inf weighs 0).
__global__ void mask_kernel(float* logits, std::int32_t vocab, const SamplingRowArgs* params,
                            const std::uint64_t* masks) {
  const auto row = static_cast<std::int64_t>(blockIdx.y);
  if (params[row].masked == 0) return;
  const std::int32_t t = static_cast<std::int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= vocab) return;
  const std::int64_t words = (vocab + 63) / 64;
  const std::uint64_t word = masks[row * words + t / 64];
  if (((word >> (t % 64)) & 1u) == 0) logits[row * vocab + t] = -INFINITY;
}

}  // namespace

void sample(float* logits, std::int64_t rows, std::int32_t vocab, const SamplingRowArgs* params,
            const std::uint64_t* masks, std::int32_t* ids, cudaStream_t stream) {
  if (rows == 0) return;
  if (masks != nullptr) {
    constexpr unsigned kMaskThreads = 256;
    const dim3 grid((static_cast<unsigned>(vocab) + kMaskThreads - 1) / kMaskThreads,
                    static_cast<unsigned>(rows));
    mask_kernel<<<grid, kMaskThreads, 0, stream>>>(logits, vocab, params, masks);
  }
  sample_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, params, ids);
}

}  // namespace troupe::gpu::kernels
