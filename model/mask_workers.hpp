// Grammar token masks computed in the background, off a step's critical path. Each
// constrained sequence's next mask is a job (`MaskJob`) that a few threads of the runner's
// own compute while the forward pass runs; a step does not wait for a job past its forward
// pass while any of its rows could sample (a row whose mask is late skips the step, and its
// job goes on). Every job has a work budget (grammar::kMaskWorkBudget) and a cancel flag:
// a job that runs out of budget fails its sequence with an error, one whose sequence is
// gone stops, so no grammar holds a thread for long (docs/structured-outputs.md).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "grammar/matcher.hpp"
#include "grammar/token_masker.hpp"

namespace troupe::model {

class MaskJob {
 public:
  using Clock = std::chrono::steady_clock;

  // The mask for `state` (a copy of the sequence's matcher) over `masker`'s vocabulary.
  MaskJob(grammar::Matcher state, std::shared_ptr<const grammar::TokenMasker> masker,
          std::uint64_t budget = grammar::kMaskWorkBudget);

  // Computes the mask (on a worker thread, or the caller's); once.
  void run();
  // The sequence no longer needs it: a job not yet started never starts, a running one
  // stops at its budget's next check.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  bool done() const;
  // Waits until done or `deadline`; whether it is done.
  bool wait_until(Clock::time_point deadline) const;
  void wait() const;

  // After done(): whether the budget ran out (or the job was cancelled) before the mask
  // was complete; the mask itself [(vocab + 63) / 64] words; the steps it took.
  bool failed() const { return failed_; }
  std::vector<std::uint64_t>& mask() { return mask_; }
  std::uint64_t steps() const { return steps_; }
  std::uint64_t budget() const { return budget_; }

 private:
  grammar::Matcher state_;
  std::shared_ptr<const grammar::TokenMasker> masker_;
  std::uint64_t budget_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable finished_;
  bool done_ = false;  // guarded by mutex_; the fields below are written before it is set
  bool failed_ = false;
  std::uint64_t steps_ = 0;
  std::vector<std::uint64_t> mask_;
};

class MaskWorkers {
 public:
  // Threads start with the first job: most runners never hold an output to a grammar.
  explicit MaskWorkers(std::size_t num_threads = default_threads());
  // Cancels every job queued or running, and joins.
  ~MaskWorkers();
  MaskWorkers(const MaskWorkers&) = delete;
  MaskWorkers& operator=(const MaskWorkers&) = delete;

  void submit(std::shared_ptr<MaskJob> job);
  // At least two, so that one grammar that spends its whole budget leaves a thread for the
  // others' masks; a quarter of the cores on a larger machine, at most eight. They run at
  // a lower priority than the forward pass's (troupe/background_priority.hpp).
  static std::size_t default_threads();

 private:
  void serve();

  std::size_t num_threads_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::shared_ptr<MaskJob>> queue_;
  std::vector<std::shared_ptr<MaskJob>> running_;
  std::vector<std::thread> threads_;
  std::size_t idle_threads_ = 0;  // threads waiting for a job
  bool stopping_ = false;
};

}  // namespace troupe::model
