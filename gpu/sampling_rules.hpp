// The rules by which sampling.cu chooses a row's kept tokens, as plain functions: nvcc
// compiles them into the kernel, the host compiler into tests/gpu/sampling_rules_test.cpp,
// which holds them to model::Sampler's rules without a device. Nothing here needs CUDA.
//
// The CPU sorts a row's candidates (logit descending, lowest id first among equals), keeps
// the first k, drops those under min_p, and keeps the shortest prefix holding top_p of the
// rest. Each step keeps a prefix of that order, so a kept set is a Cut: every token whose
// logit is above the boundary logit, and the first `take` (lowest ids) of those at it. The
// kernel finds the boundary by radix selection over order-preserving keys of the logits
// (not of the probabilities, which can round equal for different logits).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "model/host_device.hpp"

namespace troupe::gpu::sampling_rules {

constexpr int kBins = 256;  // one digit of a radix selection: 8 bits of a 32-bit key
constexpr int kDigits = 4;

// A logit the draw can ever choose: neither NaN nor -inf (model::Sampler's candidates).
TROUPE_HOST_DEVICE inline bool is_candidate(float x) {
  return x > -INFINITY;
}

TROUPE_HOST_DEVICE inline std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

TROUPE_HOST_DEVICE inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// A candidate's key: unsigned order is the logits' order, and -0 and +0 (equal logits) share
// one. Key 0 is no candidate's (it is a NaN's).
TROUPE_HOST_DEVICE inline std::uint32_t logit_key(float x) {
  const std::uint32_t u = x == 0.0f ? 0u : float_bits(x);
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

TROUPE_HOST_DEVICE inline float key_logit(std::uint32_t key) {
  return bits_float((key & 0x80000000u) != 0 ? key & 0x7fffffffu : ~key);
}

// A token's probability relative to the most likely one, exp((x - max) / T) in [0, 1]; 0 for
// NaN and -inf. Computed as model::Sampler computes it: the float expression, the float exp
// (the accurate one on the device too: the min-p cut compares it with min_p).
TROUPE_HOST_DEVICE inline float weight(float x, float max, float inverse_temperature) {
  return x == x ? std::exp((x - max) * inverse_temperature) : 0.0f;
}

// What min_p leaves a draw: a positive weight, at least min_p of the most likely token's (1).
TROUPE_HOST_DEVICE inline bool drawable(float w, float min_p) {
  return w > 0.0f && w >= min_p;
}

// A prefix of the CPU's order: every candidate with a key above `key`, and the first `take`
// in token order of those with it. {0, 0} keeps every candidate.
struct Cut {
  std::uint32_t key;
  std::int32_t take;
};

// Whether a candidate is inside the cut; `rank`: the tokens with the cut's key before it.
TROUPE_HOST_DEVICE inline bool within(const Cut& cut, std::uint32_t key, std::int32_t rank) {
  return key > cut.key || (key == cut.key && rank < cut.take);
}

TROUPE_HOST_DEVICE inline bool kept(const Cut& cut, float min_p, std::uint32_t key, float w,
                                    std::int32_t rank) {
  return drawable(w, min_p) && within(cut, key, rank);
}

// The tokens of the cut's key that a pass in no token order (a histogram, a sum) counts as one
// group: it knows no ranks, but all of them weigh `w_cut`, the weight of the cut's logit.
TROUPE_HOST_DEVICE inline std::int32_t group_size(const Cut& cut, float min_p, float w_cut) {
  return drawable(w_cut, min_p) ? cut.take : 0;
}

TROUPE_HOST_DEVICE inline float group_mass(const Cut& cut, float min_p, float w_cut) {
  return static_cast<float>(group_size(cut, min_p, w_cut)) * w_cut;
}

// Whether a token is in top-p's pool (what top-k and min_p keep) other than as the group.
TROUPE_HOST_DEVICE inline bool in_top_p_pool(const Cut& top_k, float min_p, std::uint32_t key,
                                             float w) {
  return drawable(w, min_p) && key > top_k.key;
}

// A radix selection in progress, one digit of 8 bits at a time from the top: the key bits
// chosen so far, and what the tokens under them must still supply (a count for top-k, a mass
// for top-p), +inf once rounding has left a mass out of reach. The walk over the bins runs in
// double, as the CPU's walk does (a float target would round top_p * total, and cut 10
// equal tokens at 3 where the CPU keeps 4 for top_p = 0.3f); the bins' masses are float
// sums. A plain aggregate: it lives in the kernel's shared memory.
struct RadixSelect {
  std::uint32_t prefix;
  std::uint32_t mask;
  int shift;
  double remaining;
  std::int32_t count_at_key;  // after the last digit: the tokens with exactly the key `prefix`
};

TROUPE_HOST_DEVICE inline RadixSelect radix_start(double remaining) {
  return {0u, 0u, 8 * (kDigits - 1), remaining, 0};
}

TROUPE_HOST_DEVICE inline bool under_prefix(const RadixSelect& s, std::uint32_t key) {
  return (key & s.mask) == s.prefix;
}

TROUPE_HOST_DEVICE inline int bin_of(const RadixSelect& s, std::uint32_t key) {
  return static_cast<int>((key >> s.shift) & 0xffu);
}

// The histogram bin a token counts in at this digit, and its weight `w` when counting by
// mass (top-p); -1 when it does not count: not a candidate, outside the prefix, or
// outside top-p's pool. The kernel adds it with atomics, the CPU test in token order.
TROUPE_HOST_DEVICE inline int histogram_bin(const RadixSelect& s, bool by_mass, const Cut& top_k,
                                            float min_p, float v, float max,
                                            float inverse_temperature, float& w) {
  if (!is_candidate(v)) return -1;
  const std::uint32_t key = logit_key(v);
  if (!under_prefix(s, key)) return -1;
  if (by_mass) {
    w = weight(v, max, inverse_temperature);
    if (!in_top_p_pool(top_k, min_p, key, w)) return -1;
  }
  return bin_of(s, key);
}

// Top-p's target: top_p of the pool's mass, summed over the first digit's bins from the
// top, in the order choose_digit walks them, so that the first digit always reaches it.
TROUPE_HOST_DEVICE inline double top_p_target(const std::int32_t* count, const float* mass,
                                              float top_p) {
  double total = 0.0;
  for (int b = kBins - 1; b >= 0; --b) {
    if (count[b] != 0) total += mass[b];
  }
  return static_cast<double>(top_p) * total;
}

// One digit, given the histogram of the tokens under the prefix (their count per bin, and for
// top-p their mass; `mass` null for top-k): the highest bin at which the cumulative value from
// the top reaches `remaining`. Where rounding leaves a mass short of it (a bin's tokens summed
// in another order than at the digit before), the lowest bin, and every later digit takes its
// lowest too: the cut then keeps all that is left, as the CPU's walk keeps all when its
// cumulative never reaches its target. A top-k over fewer candidates than k ends the same way.
TROUPE_HOST_DEVICE inline void choose_digit(RadixSelect& s, const std::int32_t* count,
                                            const float* mass) {
  double cumulative = 0.0;
  int selected = -1, lowest = -1;
  for (int b = kBins - 1; b >= 0; --b) {
    if (count[b] == 0) continue;
    lowest = b;
    const double here = mass != nullptr ? mass[b] : count[b];
    if (cumulative + here >= s.remaining) {
      selected = b;
      break;
    }
    cumulative += here;
  }
  if (selected >= 0) {
    s.remaining -= cumulative;
  } else {
    selected = lowest < 0 ? 0 : lowest;  // no tokens at all: an empty cut
    s.remaining = INFINITY;
  }
  s.prefix |= static_cast<std::uint32_t>(selected) << s.shift;
  s.mask |= 0xffu << s.shift;
  if (s.shift == 0) s.count_at_key = count[selected];
  s.shift -= 8;
}

// Top-k's cut once every digit is chosen: `remaining` of the key's tokens, the k-th among them.
TROUPE_HOST_DEVICE inline Cut top_k_cut(const RadixSelect& s) {
  return {s.prefix,
          s.remaining < s.count_at_key ? static_cast<std::int32_t>(s.remaining) : s.count_at_key};
}

// Top-p's cut: the CPU walks the key's tokens in id order, each weighing `w`, until the
// cumulative mass reaches the target: the fewest n with n * w >= remaining (all of them
// when rounding left the target out of reach).
TROUPE_HOST_DEVICE inline Cut top_p_cut(const RadixSelect& s, float w) {
  const double n = std::ceil(s.remaining / w);
  if (!(n < s.count_at_key)) return {s.prefix, s.count_at_key};
  return {s.prefix, n < 1.0 ? 1 : static_cast<std::int32_t>(n)};
}

}  // namespace troupe::gpu::sampling_rules
