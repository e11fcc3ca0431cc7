#include "cpu/thread_pool.hpp"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TROUPE_CPU_RELAX() _mm_pause()
#else
#define TROUPE_CPU_RELAX() std::this_thread::yield()
#endif

namespace troupe::cpu {

namespace {
// About 50-200 microseconds of spinning: covers the gap between a step's ops,
// not the gap between requests.
constexpr int kSpinIterations = 1 << 12;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = std::max(num_threads, 1) - 1;
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_tasks() {
  while (true) {
    const std::int64_t i = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (i >= num_tasks_) break;
    (*task_)(i);
  }
}

void ThreadPool::parallel_for(std::int64_t num_tasks,
                              const std::function<void(std::int64_t)>& task) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (std::int64_t i = 0; i < num_tasks; ++i) task(i);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    task_ = &task;
    num_tasks_ = num_tasks;
    next_task_.store(0);
    num_busy_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_tasks();
  // Wait for the workers still on their last task; yield if one was descheduled.
  for (int spins = 0; num_busy_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kSpinIterations)
      TROUPE_CPU_RELAX();
    else
      std::this_thread::yield();
  }
}

void ThreadPool::worker_loop() {
  std::uint64_t seen = 0;
  while (true) {
    // Spin a while for the next loop, then sleep until woken.
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) {
      TROUPE_CPU_RELAX();
      ++spins;
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_.load()) return;
    run_tasks();
    num_busy_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace troupe::cpu
