// A grammar's work, computed in the background, off a step's critical path. Each
// constrained sequence's next step of grammar work is a job (`MaskJob`): the matcher
// advanced by the bytes of the tokens taken since, then the token mask for the next
// position. A few threads of the runner's own compute jobs while the forward pass runs; a
// step does not wait for a job past its forward pass while any of its rows could sample (a
// row whose mask is late skips the step, and its job goes on). Every job has a work
// budget (grammar::kMaskWorkBudget) and a cancel flag: a job that runs out of budget fails
// its sequence with an error, one whose sequence is gone stops, so no grammar holds a
// thread, or a step, for long (docs/structured-outputs.md).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grammar/matcher.hpp"
#include "grammar/token_masker.hpp"

namespace troupe::model {

class MaskJob {
 public:
  using Clock = std::chrono::steady_clock;

  // `state` (a copy of the sequence's matcher) advanced by `taken` (the bytes of the
  // tokens taken since it was last advanced), then the mask for what follows over
  // `masker`'s vocabulary; one budget for both.
  MaskJob(grammar::Matcher state, std::string taken,
          std::shared_ptr<const grammar::TokenMasker> masker,
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

  // After done(). failed(): the budget ran out (or the job was cancelled) first, while
  // taking the bytes (failed_taking()) or making the mask; refused(): the grammar does not
  // take the bytes (a token from outside it: the mask and the matcher disagreed). Else the
  // advanced state and its mask, [(vocab + 63) / 64] words.
  bool failed() const { return failed_; }
  bool failed_taking() const { return failed_taking_; }
  bool refused() const { return refused_; }
  grammar::Matcher& state() { return state_; }
  std::vector<std::uint64_t>& mask() { return mask_; }
  std::size_t num_taken() const { return taken_.size(); }
  std::uint64_t steps() const { return steps_; }
  std::uint64_t budget() const { return budget_; }

 private:
  grammar::Matcher state_;
  std::string taken_;
  std::shared_ptr<const grammar::TokenMasker> masker_;
  std::uint64_t budget_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mutex_;
  mutable std::condition_variable finished_;
  bool done_ = false;  // guarded by mutex_; the fields below are written before it is set
  bool failed_ = false;
  bool failed_taking_ = false;
  bool refused_ = false;
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
