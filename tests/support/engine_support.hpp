// Waiting on an Engine's state from a test (its scheduler works asynchronously).
#pragma once

#include <chrono>
#include <thread>

#include "troupe/engine.hpp"

namespace troupe::test {

// Polls until the engine holds no KV blocks and no sequences (up to two seconds).
inline bool kv_drains(const Engine& engine) {
  for (int i = 0; i < 400; ++i) {
    const auto s = engine.stats();
    if (s.kv_usage == 0.0 && s.num_running == 0 && s.num_waiting == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace troupe::test
