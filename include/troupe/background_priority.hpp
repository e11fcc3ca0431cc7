// A thread's work that must not take the cores from the steps of others: token masks of
// output constraints (model/mask_workers) and their check at admission (net/). The thread
// runs at nice +10 (Linux gives each thread its own nice value): where the forward pass
// keeps every core busy it gets about a tenth of one, so a constraint that spends its
// whole work budget slows the streams beside it little (BENCHMARKS.md); where a core is
// idle it changes nothing. Raising a thread's priority again needs privileges, so only
// threads kept for such work call it.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

namespace troupe {

inline constexpr int kBackgroundNice = 10;

// For the calling thread; a refusal (a system without per-thread nice values) is harmless.
inline void lower_this_thread_priority() {
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kBackgroundNice);
}

}  // namespace troupe
