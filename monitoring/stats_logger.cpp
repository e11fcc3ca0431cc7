#include "monitoring/stats_logger.hpp"

#include <cmath>

#include "monitoring/log.hpp"

namespace troupe::monitoring {

namespace {
// One decimal, as vLLM prints throughput and percentages.
double tenth(double value) {
  return std::round(value * 10.0) / 10.0;
}
}  // namespace

StatsWindow stats_window(const EngineStats& before, const EngineStats& now, double seconds) {
  StatsWindow w;
  const double span = seconds > 0.0 ? seconds : 1.0;
  const auto prompt = now.num_prompt_tokens - before.num_prompt_tokens;
  const auto generated = now.num_generated_tokens - before.num_generated_tokens;
  w.prompt_tokens_per_second = static_cast<double>(prompt) / span;
  w.generation_tokens_per_second = static_cast<double>(generated) / span;
  w.num_running = now.num_running;
  w.num_waiting = now.num_waiting;
  w.kv_usage = now.kv_usage;
  const auto queried = now.prefix_queried_tokens - before.prefix_queried_tokens;
  if (queried > 0) {
    w.prefix_cache_hit_rate =
        static_cast<double>(now.prefix_hit_tokens - before.prefix_hit_tokens) / queried;
  }
  w.num_preemptions = now.num_preemptions - before.num_preemptions;
  const auto proposed = now.spec_num_draft_tokens - before.spec_num_draft_tokens;
  const auto drafts = now.spec_num_drafts - before.spec_num_drafts;
  if (proposed > 0 && drafts > 0) {
    const auto accepted = now.spec_num_accepted_tokens - before.spec_num_accepted_tokens;
    w.spec_acceptance_rate = static_cast<double>(accepted) / static_cast<double>(proposed);
    w.spec_mean_acceptance_length =
        1.0 + static_cast<double>(accepted) / static_cast<double>(drafts);
  }
  w.busy = prompt > 0 || generated > 0 || now.num_running > 0 || now.num_waiting > 0;
  return w;
}

void log_stats_window(const StatsWindow& w) {
  if (!w.busy) return;
  if (w.spec_acceptance_rate) {
    log_info("engine", {{"prompt_throughput_tok_s", tenth(w.prompt_tokens_per_second)},
                        {"generation_throughput_tok_s", tenth(w.generation_tokens_per_second)},
                        {"running", w.num_running},
                        {"waiting", w.num_waiting},
                        {"kv_cache_usage_pct", tenth(100.0 * w.kv_usage)},
                        {"prefix_cache_hit_rate_pct",
                         w.prefix_cache_hit_rate ? tenth(100.0 * *w.prefix_cache_hit_rate) : 0.0},
                        {"spec_acceptance_rate_pct", tenth(100.0 * *w.spec_acceptance_rate)},
                        {"spec_mean_acceptance_length",
                         std::round(w.spec_mean_acceptance_length * 100.0) / 100.0}});
  } else {
    log_info("engine", {{"prompt_throughput_tok_s", tenth(w.prompt_tokens_per_second)},
                        {"generation_throughput_tok_s", tenth(w.generation_tokens_per_second)},
                        {"running", w.num_running},
                        {"waiting", w.num_waiting},
                        {"kv_cache_usage_pct", tenth(100.0 * w.kv_usage)},
                        {"prefix_cache_hit_rate_pct",
                         w.prefix_cache_hit_rate ? tenth(100.0 * *w.prefix_cache_hit_rate) : 0.0}});
  }
  if (w.num_preemptions > 0) {
    log_warning(
        "sequences were preempted: the KV cache was full (a larger --kv-cache-gb, or a "
        "smaller --max-num-seqs, avoids recomputing them)",
        {{"preemptions", w.num_preemptions}, {"kv_cache_usage_pct", tenth(100.0 * w.kv_usage)}});
  }
}

StatsLogger::StatsLogger(std::function<EngineStats()> read, std::chrono::milliseconds interval)
    : read_(std::move(read)), interval_(interval), thread_([this] { run(); }) {}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StatsLogger::run() {
  EngineStats before = read_();
  auto then = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, interval_, [this] { return stopping_; })) {
    lock.unlock();
    const EngineStats now = read_();
    const auto at = std::chrono::steady_clock::now();
    log_stats_window(stats_window(before, now, std::chrono::duration<double>(at - then).count()));
    before = now;
    then = at;
    lock.lock();
  }
}

}  // namespace troupe::monitoring
