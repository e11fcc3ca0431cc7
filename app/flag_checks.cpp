// The checks the commands' flags share: numbers finite and within their range (CLI11's
// Range lets NaN through), paths that must not be FIFOs or devices, bounded text.
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <sstream>

#include "app/commands.hpp"
#include "text/unicode.hpp"

namespace troupe::app {

namespace {

// A value as an error quotes it: never the whole of a megabyte of text.
std::string shown(const std::string& value) {
  constexpr std::size_t kShown = 64;
  return "'" + (value.size() <= kShown ? value : value.substr(0, kShown) + "...") + "'";
}

std::string number_text(double v) {
  std::ostringstream out;
  out.precision(15);  // 1000000, not 1e+06
  out << v;
  return out.str();
}

}  // namespace

CLI::Validator number_in(double lo, double hi, bool above_lo) {
  const std::string range = (above_lo ? "(" : "[") + number_text(lo) + ", " + number_text(hi) + "]";
  return CLI::Validator(
      [lo, hi, above_lo, range](std::string& value) -> std::string {
        double v = 0.0;
        const bool read = CLI::detail::lexical_cast(value, v);
        if (read && std::isfinite(v) && (above_lo ? v > lo : v >= lo) && v <= hi) return {};
        return "expected a number in " + range + ", not " + shown(value);
      },
      "in " + range);
}

CLI::Validator text_at_most(std::size_t most) {
  return CLI::Validator(
      [most](std::string& value) -> std::string {
        if (value.size() <= most) return {};
        return "at most " + std::to_string(most) + " bytes, not " + std::to_string(value.size());
      },
      "");
}

CLI::Validator name_text(std::size_t most) {
  return CLI::Validator(
      [most](std::string& value) -> std::string {
        if (value.empty()) return "must not be empty";
        if (value.size() > most) {
          return "at most " + std::to_string(most) + " bytes, not " + std::to_string(value.size());
        }
        // It is written into every response, metric and log line: text, one line of it.
        if (text::to_valid_utf8(value) != value) return "must be UTF-8 text";
        for (const char c : value) {
          const auto byte = static_cast<unsigned char>(c);
          if (byte < 0x20 || byte == 0x7f) return "must not hold control characters";
        }
        return {};
      },
      "");
}

CLI::Validator not_special_file() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        // stat, not open: opening a FIFO for reading waits for a writer forever. A path that
        // is not there is left to the reader, which says so.
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return {};
        if (S_ISDIR(st.st_mode)) return shown(path) + " is a directory, not a file";
        return shown(path) + " is not a regular file (a FIFO, a socket or a device)";
      },
      "");
}

void bound_flag_values(CLI::App* cmd, std::size_t most, const std::vector<std::string>& unbounded) {
  for (CLI::Option* option : cmd->get_options()) {
    if (std::find(unbounded.begin(), unbounded.end(), option->get_name()) != unbounded.end()) {
      continue;
    }
    option->check(text_at_most(most));
  }
}

}  // namespace troupe::app
