#include "monitoring/process_stats.hpp"

#include <dirent.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace troupe::monitoring {

namespace {

std::optional<std::string> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  // /proc files report size 0: read to the end rather than by size.
  std::ostringstream text;
  text << in.rdbuf();
  return std::move(text).str();
}

template <typename T>
bool parse_number(std::string_view word, T& value) {
  const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
  return ec == std::errc() && end == word.data() + word.size();
}

std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  std::size_t at = 0;
  while (at < text.size()) {
    const auto begin = text.find_first_not_of(" \t\n", at);
    if (begin == std::string_view::npos) break;
    const auto end = std::min(text.find_first_of(" \t\n", begin), text.size());
    words.push_back(text.substr(begin, end - begin));
    at = end;
  }
  return words;
}

// The line of `text` that starts with `key`, without it; empty when none does.
std::optional<std::string_view> line_after(std::string_view text, std::string_view key) {
  for (std::size_t at = 0; at < text.size();) {
    const auto end = std::min(text.find('\n', at), text.size());
    const auto line = text.substr(at, end - at);
    if (line.substr(0, key.size()) == key) return line.substr(key.size());
    at = end + 1;
  }
  return std::nullopt;
}

std::optional<double> count_open_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  // The directory's own descriptor is counted too, as client_golang counts it.
  double count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") ++count;
  }
  ::closedir(dir);
  return count;
}

}  // namespace

Result<ProcStat> parse_proc_stat(std::string_view text) {
  const auto close = text.rfind(')');
  if (text.find('(') == std::string_view::npos || close == std::string_view::npos) {
    return make_error(ErrorCode::invalid_argument, "/proc stat: no (command name)");
  }
  // words[0] is field 3 (the state), so field N is words[N - 3].
  const auto words = split_words(text.substr(close + 1));
  constexpr std::size_t kUtime = 14 - 3, kStime = 15 - 3, kStarttime = 22 - 3, kVsize = 23 - 3,
                        kRss = 24 - 3;
  if (words.size() <= kRss) {
    return make_error(
        ErrorCode::invalid_argument,
        "/proc stat: " + std::to_string(words.size() + 2) + " fields, at least 24 expected");
  }
  ProcStat stat;
  if (!parse_number(words[kUtime], stat.utime_ticks) ||
      !parse_number(words[kStime], stat.stime_ticks) ||
      !parse_number(words[kStarttime], stat.starttime_ticks) ||
      !parse_number(words[kVsize], stat.vsize_bytes) ||
      !parse_number(words[kRss], stat.rss_pages)) {
    return make_error(ErrorCode::invalid_argument,
                      "/proc stat: a field among 14, 15, 22, 23, 24 is not a number");
  }
  return stat;
}

Result<double> parse_boot_time(std::string_view text) {
  const auto rest = line_after(text, "btime ");
  std::uint64_t seconds = 0;
  if (!rest || split_words(*rest).size() != 1 || !parse_number(split_words(*rest)[0], seconds)) {
    return make_error(ErrorCode::invalid_argument, "/proc/stat: no \"btime <seconds>\" line");
  }
  return static_cast<double>(seconds);
}

Result<double> parse_max_open_files(std::string_view text) {
  // "Max open files            1024                 1048576              files"
  const auto rest = line_after(text, "Max open files");
  const auto words = rest ? split_words(*rest) : std::vector<std::string_view>{};
  if (words.empty()) {
    return make_error(ErrorCode::invalid_argument, "/proc limits: no \"Max open files\" line");
  }
  if (words[0] == "unlimited") return std::numeric_limits<double>::infinity();
  std::uint64_t soft = 0;
  if (!parse_number(words[0], soft)) {
    return make_error(ErrorCode::invalid_argument,
                      "/proc limits: \"Max open files\" soft limit is not a number");
  }
  return static_cast<double>(soft);
}

ProcessStats read_process_stats() {
  ProcessStats stats;
  const auto ticks_per_second = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const auto page_size = static_cast<double>(::sysconf(_SC_PAGESIZE));
  const auto stat_text = read_file("/proc/self/stat");
  if (const auto stat = parse_proc_stat(stat_text.value_or("")); stat && ticks_per_second > 0) {
    stats.cpu_seconds =
        static_cast<double>(stat->utime_ticks + stat->stime_ticks) / ticks_per_second;
    stats.virtual_memory_bytes = static_cast<double>(stat->vsize_bytes);
    if (page_size > 0) {
      stats.resident_memory_bytes = static_cast<double>(stat->rss_pages) * page_size;
    }
    if (const auto boot = parse_boot_time(read_file("/proc/stat").value_or(""))) {
      stats.start_time_seconds =
          *boot + static_cast<double>(stat->starttime_ticks) / ticks_per_second;
    }
  }
  stats.open_fds = count_open_fds();
  if (const auto max = parse_max_open_files(read_file("/proc/self/limits").value_or(""))) {
    stats.max_fds = *max;
  }
  return stats;
}

}  // namespace troupe::monitoring
