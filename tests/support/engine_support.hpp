// Waiting on an Engine's state from a test (its scheduler works asynchronously).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "troupe/engine.hpp"

namespace troupe::test {

// The engine settings the actor and server tests start from: the model at `model_path` on
// `num_threads` CPU threads, `num_kv_blocks` KV blocks of 4 tokens, at most 64 tokens a
// step. Each test changes what it needs from there.
inline EngineConfig small_engine_config(std::string model_path, int num_threads,
                                        std::int32_t num_kv_blocks) {
  EngineConfig c;
  c.model_path = std::move(model_path);
  c.num_threads = num_threads;
  c.block_size = 4;
  c.num_kv_blocks = num_kv_blocks;
  c.max_num_batched_tokens = 64;
  return c;
}

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

// After a run with a draft model proposing in every step: drafts were verified, and the
// model as its own draft (`same`) had every greedy proposal accepted, another model not all.
inline void check_draft_acceptance(const EngineStats& stats, bool same) {
  CHECK(stats.spec_num_drafts > 0);
  if (same) {
    CHECK(stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens);
  } else {
    CHECK(stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens);
  }
}

}  // namespace troupe::test
