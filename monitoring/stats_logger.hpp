// The engine's line in the log while it works, as vLLM prints it: prompt and generation
// throughput, running and waiting requests, KV usage and the prefix cache's hit rate (and,
// with speculative decoding, its acceptance rate), every interval; a warning when sequences were
// preempted. Quiet while the engine is idle.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "troupe/stats.hpp"

namespace troupe::monitoring {

// What changed between two readings of the engine's totals, `seconds` apart.
struct StatsWindow {
  double prompt_tokens_per_second = 0.0;
  double generation_tokens_per_second = 0.0;
  std::int32_t num_running = 0;
  std::int32_t num_waiting = 0;
  double kv_usage = 0.0;
  // Of the prompt tokens looked up in the window; none looked up: no rate.
  std::optional<double> prefix_cache_hit_rate;
  std::int64_t num_preemptions = 0;  // new in the window
  // Speculative decoding in the window: accepted of proposed tokens, and the mean tokens a
  // draft's step gave its sequence (1 + accepted per draft); none proposed: no rate.
  std::optional<double> spec_acceptance_rate;
  double spec_mean_acceptance_length = 0.0;
  // Anything ran, or anything is running or waiting: an idle engine writes no line.
  bool busy = false;
};
StatsWindow stats_window(const EngineStats& before, const EngineStats& now, double seconds);

// Logs the window (info) and its preemptions (warning); nothing when it was idle.
void log_stats_window(const StatsWindow& window);

// A thread that reads the engine every `interval` and logs the window; stops when
// destroyed. `read` must be safe to call from that thread.
class StatsLogger {
 public:
  StatsLogger(std::function<EngineStats()> read, std::chrono::milliseconds interval);
  ~StatsLogger();
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

 private:
  void run();

  std::function<EngineStats()> read_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace troupe::monitoring
