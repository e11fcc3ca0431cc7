// The process's own resources, read from /proc as the Prometheus client libraries read
// them for their process_* metrics (client_golang's process collector): CPU time,
// memory, descriptors and start time. Read at scrape time; no thread of its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "troupe/result.hpp"

namespace troupe::monitoring {

// What /proc/<pid>/stat says, in its own units (clock ticks, pages).
struct ProcStat {
  std::uint64_t utime_ticks = 0;      // field 14: user CPU time
  std::uint64_t stime_ticks = 0;      // field 15: system CPU time
  std::uint64_t starttime_ticks = 0;  // field 22: since boot
  std::uint64_t vsize_bytes = 0;      // field 23
  std::int64_t rss_pages = 0;         // field 24
};

// The text of /proc/<pid>/stat. The command name (field 2) is in parentheses and may hold
// spaces and ')': the fields after it are counted from its last ')'.
Result<ProcStat> parse_proc_stat(std::string_view text);
// The system's boot time in seconds since the epoch: the "btime" line of /proc/stat.
Result<double> parse_boot_time(std::string_view text);
// The soft "Max open files" of /proc/<pid>/limits; "unlimited" is +Inf.
Result<double> parse_max_open_files(std::string_view text);

// In the units of the process_* metrics. A field /proc would not give is empty, and its
// metric is left out of the exposition rather than shown as a made-up 0.
struct ProcessStats {
  std::optional<double> cpu_seconds;            // process_cpu_seconds_total
  std::optional<double> resident_memory_bytes;  // process_resident_memory_bytes
  std::optional<double> virtual_memory_bytes;   // process_virtual_memory_bytes
  std::optional<double> start_time_seconds;     // process_start_time_seconds (epoch)
  std::optional<double> open_fds;               // process_open_fds
  std::optional<double> max_fds;                // process_max_fds
};

// This process's, now (a few small reads of /proc/self and /proc/stat).
ProcessStats read_process_stats();

}  // namespace troupe::monitoring
