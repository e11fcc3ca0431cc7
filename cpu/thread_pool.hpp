// A fixed pool of compute threads that run one parallel loop at a time; the
// calling thread works too. Workers spin briefly between loops (a decode step
// is many short loops) and then sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls task(i) for every i in [0, num_tasks), spread over all threads;
  // returns when all are done. Not reentrant.
  void parallel_for(std::int64_t num_tasks, const std::function<void(std::int64_t)>& task);

 private:
  void worker_loop();
  void run_tasks();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<std::int64_t> next_task_{0};
  std::atomic<int> num_busy_{0};
  std::int64_t num_tasks_ = 0;
  const std::function<void(std::int64_t)>* task_ = nullptr;
};

}  // namespace troupe::cpu
