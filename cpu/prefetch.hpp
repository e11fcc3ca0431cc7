// How far ahead of the weight bytes it is reading a matmul asks the cache for more (a
// software prefetch): the hardware prefetcher alone left decode, which streams the weights
// once, well below the memory's bandwidth. One distance for the float kernels (kernels.cpp)
// and both int8 paths (int8_matmul_impl.hpp, int8_repacked_impl.hpp).
#pragma once

#include <cstddef>

namespace troupe::cpu {

inline constexpr std::size_t kPrefetchBytes = 4096;

}  // namespace troupe::cpu
