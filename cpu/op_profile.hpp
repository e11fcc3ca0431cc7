// Where a CPU step's time goes, op by op (bench forward --profile): wall time of each op the
// backend runs, its calls, and for matmuls the multiply-adds done and weight bytes read.
// Off unless a profile is given; an op inside another (moe_ffn's router matmul) counts in
// the outer one only, so the shares add up to the step.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace troupe::cpu {

struct OpProfile {
  struct Op {
    double seconds = 0.0;
    std::int64_t calls = 0;
    double macs = 0.0;          // multiply-adds (matmuls)
    double weight_bytes = 0.0;  // weight bytes read (matmuls)
  };
  std::map<std::string, Op> ops;
  int depth = 0;  // ops running now (an op inside another is the outer one's time)

  double total_seconds() const {
    double total = 0.0;
    for (const auto& [name, op] : ops) total += op.seconds;
    return total;
  }
};

// Times one op into a profile (or nothing, without one).
class OpTimer {
 public:
  OpTimer() = default;
  OpTimer(OpProfile* profile, std::string name, double macs = 0.0, double weight_bytes = 0.0)
      : profile_(profile), name_(std::move(name)), macs_(macs), bytes_(weight_bytes) {
    if (profile_ != nullptr && profile_->depth++ == 0) start_ = Clock::now();
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;
  ~OpTimer() {
    if (profile_ == nullptr || --profile_->depth != 0) return;
    OpProfile::Op& op = profile_->ops[name_];
    op.seconds += std::chrono::duration<double>(Clock::now() - start_).count();
    op.calls += 1;
    op.macs += macs_;
    op.weight_bytes += bytes_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  OpProfile* profile_ = nullptr;
  std::string name_;
  double macs_ = 0.0, bytes_ = 0.0;
  Clock::time_point start_;
};

}  // namespace troupe::cpu
