// Collects the events of many requests from an Engine; waits for their ends.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/engine.hpp"

namespace troupe::test {

// Thread-safe: the callback runs on engine threads, the waits on the test's.
class Collector {
 public:
  TokenCallback callback() {
    return [this](const TokenEvent& e) {
      std::lock_guard lock(mutex_);
      auto& r = results_[e.request_id];
      if (e.token != kNoToken) r.tokens.push_back(e.token);
      r.text += e.text;
      if (e.finished) {
        r.end = e;
        ++num_finished_;
        done_.notify_all();
      }
    };
  }
  struct Result {
    std::vector<TokenId> tokens;
    std::string text;
    std::optional<TokenEvent> end;
  };
  bool wait(std::size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock lock(mutex_);
    return done_.wait_for(lock, timeout, [&] { return num_finished_ >= n; });
  }
  Result get(RequestId id) {
    std::lock_guard lock(mutex_);
    return results_[id];
  }
  std::size_t num_tokens(RequestId id) {
    std::lock_guard lock(mutex_);
    return results_[id].tokens.size();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<RequestId, Result> results_;
  std::size_t num_finished_ = 0;
};

}  // namespace troupe::test
