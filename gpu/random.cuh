// Counter-based random numbers on the device, the same on every run and device: weight
// initialisation (kernels.cu) and seeded sampling (sampling.cu) draw with mix64(seed ^ mix64(i)).
#pragma once

#include <cstdint>

namespace troupe::gpu::kernels {

// splitmix64's step and finalizer: a bijection of 64 bits that scrambles a counter.
__device__ __forceinline__ std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace troupe::gpu::kernels
