// The /proc parsers behind the process_* metrics, on fixed texts: the fields they take,
// and a clear error (never a crash) for text they cannot read.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "monitoring/process_stats.hpp"

using namespace troupe;
using namespace troupe::monitoring;

namespace {

// /proc/<pid>/stat of a `cat`, with utime 11, stime 4, starttime 35599, vsize 3133440 and
// rss 407 put in fields 14, 15, 22, 23 and 24.
std::string stat_line(const std::string& command) {
  return "7873 (" + command +
         ") R 7871 7871 3933 0 -1 4194304 100 0 0 0 11 4 0 0 20 0 1 0 35599 3133440 407 "
         "18446744073709551615 93890782404608 93890782424489 140731238952960 0 0 0 0 0 0 0 0 "
         "0 17 0 0 0 0 0 0\n";
}

}  // namespace

TEST_CASE("/proc/<pid>/stat: CPU ticks, start, memory", "[monitoring]") {
  const auto stat = parse_proc_stat(stat_line("cat"));
  REQUIRE(stat.has_value());
  CHECK(stat->utime_ticks == 11);
  CHECK(stat->stime_ticks == 4);
  CHECK(stat->starttime_ticks == 35599);
  CHECK(stat->vsize_bytes == 3133440);
  CHECK(stat->rss_pages == 407);
}

TEST_CASE("/proc/<pid>/stat: a command name with spaces and parentheses", "[monitoring]") {
  // The name is the program's to choose (prctl): fields are counted from its last ')'.
  const auto stat = parse_proc_stat(stat_line("troupe ) R 1 2 (x"));
  REQUIRE(stat.has_value());
  CHECK(stat->utime_ticks == 11);
  CHECK(stat->rss_pages == 407);
}

TEST_CASE("/proc/<pid>/stat: unreadable text is an error", "[monitoring]") {
  std::string not_a_number = stat_line("cat");
  not_a_number.replace(not_a_number.find(" 11 "), 4, " x1 ");
  for (const std::string& text :
       {std::string(), std::string("7873 cat R 1 2 3"),
        std::string("7873 (cat) R 7871 7871 3933 0 -1 4194304"), not_a_number}) {
    INFO(text);
    const auto stat = parse_proc_stat(text);
    REQUIRE_FALSE(stat.has_value());
    CHECK(stat.error().code == ErrorCode::invalid_argument);
    CHECK(stat.error().message.find("/proc stat") == 0);
  }
}

TEST_CASE("/proc/stat: the boot time", "[monitoring]") {
  const auto boot =
      parse_boot_time("cpu  1 2 3\nintr 5 6\nctxt 99\nbtime 1796218215\nprocesses 7873\n");
  REQUIRE(boot.has_value());
  CHECK(*boot == 1796218215.0);
  CHECK_FALSE(parse_boot_time("cpu  1 2 3\nbtimes 5\n").has_value());
  CHECK_FALSE(parse_boot_time("btime soon\n").has_value());
  CHECK_FALSE(parse_boot_time("").has_value());
}

TEST_CASE("/proc/<pid>/limits: the soft limit of open files", "[monitoring]") {
  const std::string limits =
      "Limit                     Soft Limit           Hard Limit           Units     \n"
      "Max processes             63452                63452                processes \n"
      "Max open files            1024                 1048576              files     \n";
  const auto max = parse_max_open_files(limits);
  REQUIRE(max.has_value());
  CHECK(*max == 1024.0);
  const auto unlimited =
      parse_max_open_files("Max open files            unlimited            unlimited   files\n");
  REQUIRE(unlimited.has_value());
  CHECK(std::isinf(*unlimited));
  CHECK_FALSE(parse_max_open_files("Max processes  63452  63452  processes\n").has_value());
  CHECK_FALSE(parse_max_open_files("Max open files            many    many   files\n").has_value());
}

TEST_CASE("this process's stats are all there and plausible", "[monitoring]") {
  const auto stats = read_process_stats();
  REQUIRE(stats.cpu_seconds.has_value());
  REQUIRE(stats.resident_memory_bytes.has_value());
  REQUIRE(stats.virtual_memory_bytes.has_value());
  REQUIRE(stats.start_time_seconds.has_value());
  REQUIRE(stats.open_fds.has_value());
  REQUIRE(stats.max_fds.has_value());
  CHECK(*stats.cpu_seconds >= 0.0);
  CHECK(*stats.resident_memory_bytes > 0.0);
  CHECK(*stats.virtual_memory_bytes >= *stats.resident_memory_bytes);
  CHECK(*stats.open_fds >= 3.0);  // stdin, stdout, stderr (and /proc/self/fd itself)
  CHECK(*stats.max_fds >= *stats.open_fds);
}
