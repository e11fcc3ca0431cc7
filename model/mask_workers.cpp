#include "model/mask_workers.hpp"

#include <algorithm>

#include "troupe/background_priority.hpp"

namespace troupe::model {

MaskJob::MaskJob(grammar::Matcher state, std::string taken,
                 std::shared_ptr<const grammar::TokenMasker> masker, std::uint64_t budget)
    : state_(std::move(state)),
      taken_(std::move(taken)),
      masker_(std::move(masker)),
      budget_(budget) {}

void MaskJob::run() {
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
  }
  grammar::WorkBudget work(budget_, &cancelled_);
  if (cancelled()) {
    failed_ = true;
  } else if (!taken_.empty() && !state_.accept_bytes(taken_, &work)) {
    failed_ = failed_taking_ = work.exhausted();
    refused_ = !work.exhausted();
  } else {
    failed_ = !masker_->fill_mask(state_, mask_, &work);
  }
  steps_ = work.spent();
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  finished_.notify_all();
}

bool MaskJob::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

bool MaskJob::wait_until(Clock::time_point deadline) const {
  std::unique_lock lock(mutex_);
  return finished_.wait_until(lock, deadline, [this] { return done_; });
}

void MaskJob::wait() const {
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [this] { return done_; });
}

std::size_t MaskWorkers::default_threads() {
  return std::clamp<std::size_t>(std::thread::hardware_concurrency() / 4, 2, 8);
}

MaskWorkers::MaskWorkers(std::size_t num_threads)
    : num_threads_(std::max<std::size_t>(num_threads, 1)) {}

MaskWorkers::~MaskWorkers() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (const auto& job : queue_) job->cancel();
    for (const auto& job : running_) job->cancel();
  }
  queued_.notify_all();
  for (std::thread& t : threads_) t.join();
  // Jobs never started are finished as failed, so that no one waits on them forever.
  for (const auto& job : queue_) job->run();
}

void MaskWorkers::submit(std::shared_ptr<MaskJob> job) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      job->cancel();
    } else {
      queue_.push_back(job);
      // A thread per job waiting, up to the limit: an idle pool holds no threads.
      if (threads_.size() < num_threads_ && queue_.size() > idle_threads_) {
        threads_.emplace_back([this] { serve(); });
        ++idle_threads_;
      }
      job.reset();
    }
  }
  if (job) {
    job->run();  // cancelled: finishes at once, failed
    return;
  }
  queued_.notify_one();
}

void MaskWorkers::serve() {
  lower_this_thread_priority();
  std::unique_lock lock(mutex_);
  while (true) {
    queued_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    std::shared_ptr<MaskJob> job = std::move(queue_.front());
    queue_.pop_front();
    --idle_threads_;
    running_.push_back(job);
    lock.unlock();
    job->run();
    lock.lock();
    running_.erase(std::find(running_.begin(), running_.end(), job));
    ++idle_threads_;
  }
}

}  // namespace troupe::model
