// What the GPU tests share: the device or a clean skip, fresh random inputs, and
// the relative error between a GPU result and the CPU backend's.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "gpu/cuda_backend.hpp"
#include "support/test_support.hpp"

namespace troupe::test {

// A CUDA backend, or the test skips (exit 77) saying why there is none.
inline std::unique_ptr<gpu::CudaBackend> gpu_or_skip(gpu::CudaBackendOptions options = {}) {
  auto device = gpu::probe_device(options.device);
  if (!device) skip_test(device.error().message + " (the GPU tests need an NVIDIA GPU)");
  auto backend = gpu::CudaBackend::create(options);
  if (!backend) {
    std::printf("failed: %s\n", backend.error().message.c_str());
    std::exit(1);
  }
  return std::move(*backend);
}

// Fresh inputs every run; the seed is printed so that a failure can be replayed.
inline std::mt19937_64& rng() {
  static std::mt19937_64 engine = [] {
    std::uint64_t seed = std::random_device{}();
    if (const char* s = std::getenv("TROUPE_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
    std::printf("random inputs from seed %llu (TROUPE_TEST_SEED replays it)\n",
                static_cast<unsigned long long>(seed));
    return std::mt19937_64(seed);
  }();
  return engine;
}

inline std::vector<float> random_floats(std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng());
  return v;
}

// ||a - b|| / ||b||; NaN anywhere (an unwritten, poisoned output) gives infinity.
inline double relative_error(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0.0, ref = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return ref == 0.0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

}  // namespace troupe::test
