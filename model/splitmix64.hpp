// splitmix64 (Steele, Lea and Flood's SplittableRandom): a counter advanced by a fixed odd
// step and scrambled by a bijection of 64 bits. The random model's weights
// (model/random_model), the GPU's counter-based draws (gpu/random.cuh), the sampler's draws
// on the host and the device (sampling_draw below) and the cluster simulator's fake tokens
// (bench/cluster_sim) all mix with this one finaliser, so that a seed gives the same numbers
// on every machine and on the device. Host and device code (nvcc) both compile it.
#pragma once

#include <cstdint>

#include "model/host_device.hpp"

namespace troupe::model {

// The step between two states: 2^64 over the golden ratio, odd.
inline constexpr std::uint64_t kSplitMix64Step = 0x9e3779b97f4a7c15ULL;

// The finaliser: every bit of `z` moves every bit of the result.
TROUPE_HOST_DEVICE constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One step and the finaliser: the state after `z`, scrambled (the reference generator's
// next(), and gpu/random.cuh's mix64).
TROUPE_HOST_DEVICE constexpr std::uint64_t splitmix64_next(std::uint64_t z) {
  return splitmix64_mix(z + kSplitMix64Step);
}

// A sequence's sampling key from its request's seed: what sampling_draw takes.
TROUPE_HOST_DEVICE constexpr std::uint64_t sampling_key(std::uint64_t seed) {
  return seed * kSplitMix64Step + 1;
}

// The random 64 bits a sequence draws its token at `position` with (the number of tokens it
// generated before it): a pure function of (key, position), with no stream of earlier draws
// behind it. So a sequence resumed after k tokens (on another worker or node) draws what it
// would have drawn, the host (model::Sampler) and the device (gpu/sampling.cu) draw the same
// values, and neither the batch nor preemption moves them.
TROUPE_HOST_DEVICE constexpr std::uint64_t sampling_draw(std::uint64_t key,
                                                         std::uint64_t position) {
  return splitmix64_next(key ^ splitmix64_next(position + 0x632BE59BD9B4E019ULL));
}

// A draw as a uniform number in [0, 1): its top 53 bits, exact in a double on every platform.
TROUPE_HOST_DEVICE constexpr double draw_unit(std::uint64_t r) {
  return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace troupe::model
