// Waiting on an Engine's state from a test (its scheduler works asynchronously).
#pragma once

#include <chrono>
#include <thread>
#include <vector>

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

// A greedy request that runs to max_tokens (EOS ignored).
inline GenerateRequest greedy(std::vector<TokenId> prompt, int max_tokens) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0.0f;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

}  // namespace troupe::test
