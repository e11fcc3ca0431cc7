// How much work one computation over a grammar may do: a token mask, or a token's bytes
// taken by a matcher. Work is counted, not timed: every branch position a byte copies or
// expands through, and every byte of a token a mask walks, costs one step. So whether a
// computation fits its budget is the same on every machine, in every run and at any load,
// and a grammar refused once is refused always.
#pragma once

#include <atomic>
#include <cstdint>

namespace troupe::grammar {

// Steps one token mask (or one token's advance) may take. A JSON schema's costliest mask over
// a 32K vocabulary takes about 10^5-10^6 steps and most are cached lookups after; the
// budget is 50 times that, 0.4-1 s of one core here (BENCHMARKS.md, "Bounded constrained
// decoding"). A grammar that needs more is one whose branches multiply (".*.*.*...z"):
// refused at the request where its start shows it, ended with an error where it shows
// later.
inline constexpr std::uint64_t kMaskWorkBudget = std::uint64_t{1} << 25;

class WorkBudget {
 public:
  // `cancelled`, when another thread sets it, ends the work as a spent budget does.
  explicit WorkBudget(std::uint64_t limit = kMaskWorkBudget,
                      const std::atomic<bool>* cancelled = nullptr)
      : limit_(limit), cancelled_(cancelled) {}

  // Spends `steps`; false once the limit has been passed or the work cancelled, and ever
  // after.
  bool spend(std::uint64_t steps) {
    spent_ += steps;
    if (spent_ > limit_) exhausted_ = true;
    // The flag is read every 4096 steps or so: cheap, and soon enough.
    if (cancelled_ != nullptr && (spent_ >> 12) != (checked_ >> 12)) {
      checked_ = spent_;
      if (cancelled_->load(std::memory_order_relaxed)) exhausted_ = cancelled_by_flag_ = true;
    }
    return !exhausted_;
  }
  bool exhausted() const { return exhausted_; }
  // Whether the work ended because `cancelled` was set (not because the limit was passed).
  bool cancelled() const { return cancelled_by_flag_; }
  std::uint64_t spent() const { return spent_; }
  std::uint64_t limit() const { return limit_; }

 private:
  std::uint64_t limit_;
  const std::atomic<bool>* cancelled_;
  std::uint64_t spent_ = 0;
  std::uint64_t checked_ = 0;
  bool exhausted_ = false;
  bool cancelled_by_flag_ = false;
};

}  // namespace troupe::grammar
