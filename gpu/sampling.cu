// Sampling on the device: one block per row of logits. Greedy is an argmax. Otherwise the
// kept set is model::Sampler's: in its order (logit descending, lowest id first among
// equals) the first top_k, then those whose probability relative to the most likely one,
// w = exp((x - max) / T), reaches min_p, then the shortest prefix holding top_p of their
// mass. Each is a prefix of that order, a Cut (sampling_rules.hpp): the tokens above a
// boundary logit and the lowest ids at it. The boundary is found by radix selection over the
// logits' order-preserving bits, counting (top-k) or weighing (top-p) in shared-memory
// histograms, so nothing is sorted; how many of the boundary's tokens stay follows from the
// count or mass still missing there. The draw is an inverse-CDF scan in token order with a
// counter-based uniform; it ranks the boundary's tokens as it goes.
#include <cmath>
#include <cstdint>

#include "gpu/kernels.hpp"
#include "gpu/random.cuh"
#include "gpu/sampling_rules.hpp"

namespace troupe::gpu::kernels {

namespace {

namespace rules = sampling_rules;

constexpr int kThreads = 512;  // 1024 would cap registers at 32 and spill
constexpr int kWarps = kThreads / 32;
constexpr int kBins = rules::kBins;

struct Shared {
  float values[kWarps];
  std::int32_t indices[kWarps];
  std::int32_t at_cut[kWarps];  // per warp, in the draw's chunk: tokens with the cut's key
  float bin_mass[kBins];
  std::int32_t bin_count[kBins];
  rules::RadixSelect select;
  float carry;
  std::int32_t carry_at_cut;
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

// The cut of a radix selection over the logits' keys. By count (top_p < 0): the first
// `top_k_count` candidates. By mass: the shortest prefix of what `top_k` and min_p keep that
// holds `top_p` of its mass; `top_k`'s own boundary tokens enter as one group (a strided
// pass cannot rank them).
__device__ rules::Cut select_cut(const float* x, std::int32_t vocab, float max,
                                 float inverse_temperature, float top_k_count, float top_p,
                                 rules::Cut top_k, float min_p, Shared& sh) {
  const bool by_mass = top_p >= 0.0f;
  const float w_group = rules::weight(rules::key_logit(top_k.key), max, inverse_temperature);
  const std::int32_t group = by_mass ? rules::group_size(top_k, min_p, w_group) : 0;
  __syncthreads();  // every thread has read the last selection
  if (threadIdx.x == 0) sh.select = rules::radix_start(top_k_count);
  for (int digit = 0; digit < rules::kDigits; ++digit) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.bin_mass[b] = 0.0f;
      sh.bin_count[b] = 0;
    }
    __syncthreads();
    const rules::RadixSelect s = sh.select;
    for (std::int32_t i = threadIdx.x; i < vocab; i += kThreads) {
      float w = 0.0f;
      const int bin =
          rules::histogram_bin(s, by_mass, top_k, min_p, x[i], max, inverse_temperature, w);
      if (bin < 0) continue;
      if (by_mass) atomicAdd(&sh.bin_mass[bin], w);
      atomicAdd(&sh.bin_count[bin], 1);
    }
    if (threadIdx.x == 0 && group > 0 && rules::under_prefix(s, top_k.key)) {
      const int bin = rules::bin_of(s, top_k.key);
      atomicAdd(&sh.bin_count[bin], group);
      atomicAdd(&sh.bin_mass[bin], static_cast<float>(group) * w_group);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      if (by_mass && digit == 0) {
        sh.select.remaining = rules::top_p_target(sh.bin_count, sh.bin_mass, top_p);
      }
      rules::choose_digit(sh.select, sh.bin_count, by_mass ? sh.bin_mass : nullptr);
    }
    __syncthreads();
  }
  const rules::RadixSelect s = sh.select;
  if (!by_mass) return rules::top_k_cut(s);
  return rules::top_p_cut(s, rules::weight(rules::key_logit(s.prefix), max, inverse_temperature));
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

  // As the CPU: top-k first, then top-p over what top-k and min_p keep. The most likely
  // token always stays (the lowest id of the highest key, weighing 1 >= min_p).
  rules::Cut cut{0u, 0};  // every candidate
  if (p.top_k > 0 && p.top_k < vocab) {
    cut = select_cut(x, vocab, best, inverse_temperature, static_cast<float>(p.top_k), -1.0f, cut,
                     0.0f, sh);
  }
  if (p.top_p < 1.0f) {
    cut = select_cut(x, vocab, best, inverse_temperature, 0.0f, p.top_p, cut, p.min_p, sh);
  }
  const float w_cut = rules::weight(rules::key_logit(cut.key), best, inverse_temperature);

  // The kept mass: the cut's key's tokens as a group, the rest one by one.
  float total = 0.0f;
  for (std::int32_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x[i];
    const float w = rules::weight(v, best, inverse_temperature);
    const std::uint32_t key = rules::logit_key(v);
    if (key != cut.key && rules::kept(cut, p.min_p, key, w, 0)) total += w;
  }
  total = block_sum(total, sh) + rules::group_mass(cut, p.min_p, w_cut);
  // The host's draw for this position (model/splitmix64.hpp), so host and device agree.
  const float u =
      static_cast<float>(model::draw_unit(model::sampling_draw(p.seed, p.counter))) * total;

  // Inverse CDF in token order: a block-wide scan per chunk of kThreads tokens, which also
  // ranks the tokens with the cut's key (a ballot in each warp, counts across warps).
  if (threadIdx.x == 0) {
    sh.carry = 0.0f;
    sh.carry_at_cut = 0;
    sh.found = vocab;
  }
  const unsigned lane = threadIdx.x % 32;
  std::int32_t last_kept = -1;
  for (std::int32_t base = 0; base < vocab; base += kThreads) {
    const std::int32_t i = base + static_cast<std::int32_t>(threadIdx.x);
    float w = 0.0f;
    std::uint32_t key = 0;
    bool at_cut = false;
    if (i < vocab) {
      const float v = x[i];
      w = rules::weight(v, best, inverse_temperature);
      key = rules::logit_key(v);
      at_cut = rules::is_candidate(v) && key == cut.key;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, at_cut);
    if (lane == 0) sh.at_cut[threadIdx.x / 32] = __popc(ballot);
    __syncthreads();
    std::int32_t rank = sh.carry_at_cut + __popc(ballot & ((1u << lane) - 1u));
    for (int wi = 0; wi < static_cast<int>(threadIdx.x / 32); ++wi) rank += sh.at_cut[wi];
    if (!rules::kept(cut, p.min_p, key, w, rank)) w = 0.0f;
    if (w > 0.0f) last_kept = i;
    float inclusive = w;  // warp scan
    for (int o = 1; o < 32; o <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, inclusive, o);
      if (lane >= static_cast<unsigned>(o)) inclusive += up;
    }
    if (lane == 31) sh.values[threadIdx.x / 32] = inclusive;
    __syncthreads();
    float before = sh.carry;
    for (int wi = 0; wi < static_cast<int>(threadIdx.x / 32); ++wi) before += sh.values[wi];
    const bool crosses = w > 0.0f && before + inclusive > u;
    const std::int32_t first = block_min_index(crosses ? i : vocab, sh);
    if (first < vocab) {
      if (threadIdx.x == 0) sh.found = first;
      break;
    }
    if (threadIdx.x == kThreads - 1) {
      sh.carry = before + inclusive;
      sh.carry_at_cut = rank + (at_cut ? 1 : 0);
    }
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
