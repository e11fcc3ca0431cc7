// Counter-based random numbers on the device, the same on every run and device: weight
// initialisation (kernels.cu) draws with mix64(seed ^ mix64(i)); seeded sampling (sampling.cu)
// with model::sampling_draw, the same mixing shared with the host's sampler.
#pragma once

#include <cstdint>

#include "model/splitmix64.hpp"

namespace troupe::gpu::kernels {

// splitmix64's step and finaliser (model/splitmix64.hpp): a bijection of 64 bits that
// scrambles a counter.
__device__ __forceinline__ std::uint64_t mix64(std::uint64_t z) {
  return model::splitmix64_next(z);
}

}  // namespace troupe::gpu::kernels
