// splitmix64 (Steele, Lea and Flood's SplittableRandom): a counter advanced by a fixed odd
// step and scrambled by a bijection of 64 bits. The random model's weights
// (model/random_model), the GPU's counter-based draws (gpu/random.cuh) and the cluster
// simulator's fake tokens (bench/cluster_sim) all mix with this one finaliser, so that a
// seed gives the same numbers on every machine and on the device. Host and device code
// (nvcc) both compile it.
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

}  // namespace troupe::model
