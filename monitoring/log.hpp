// The server's log: leveled lines on stderr, as text for a person or as one JSON object
// per line for a collector (--log-level, --log-format). Lines are written by a background
// thread from a bounded queue that drops its oldest line when full, so a slow stderr never
// stalls a request or a step. spdlog is behind this file; callers see only what is here.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

namespace troupe::monitoring {

enum class LogLevel { debug, info, warning, error, off };
enum class LogFormat { text, json };

// "debug", "info", "warning" (or "warn"), "error", "off"; any case (vLLM's are upper case).
std::optional<LogLevel> parse_log_level(std::string_view name);
std::optional<LogFormat> parse_log_format(std::string_view name);

// Process-wide; the default (before any call) is info, text. Safe to call again.
void configure_logging(LogLevel level, LogFormat format);
// Waits (a second at most) until what is queued is written: before a plain stderr line
// that must follow it, or an exit.
void flush_logging();
bool log_enabled(LogLevel level);

// One key=value of a line. Text renders a string with spaces or quotes quoted; JSON
// renders each field as a member of the line's object.
struct LogField {
  // monostate: no value ("-" as text, null as JSON).
  using Value = std::variant<std::monostate, std::string_view, std::int64_t, double, bool>;
  LogField(std::string_view key, std::nullptr_t) : key(key) {}
  LogField(std::string_view key, std::string_view value) : key(key), value(value) {}
  LogField(std::string_view key, const char* value) : key(key), value(std::string_view(value)) {}
  LogField(std::string_view key, const std::string& value)
      : key(key), value(std::string_view(value)) {}
  LogField(std::string_view key, bool value) : key(key), value(value) {}
  LogField(std::string_view key, double value) : key(key), value(value) {}
  template <typename Int>
  requires std::is_integral_v<Int> LogField(std::string_view key, Int value)
      : key(key), value(static_cast<std::int64_t>(value)) {}

  std::string_view key;
  Value value;
};

void log(LogLevel level, std::string_view message, std::span<const LogField> fields);
inline void log(LogLevel level, std::string_view message,
                std::initializer_list<LogField> fields = {}) {
  log(level, message, std::span<const LogField>(fields.begin(), fields.size()));
}

inline void log_debug(std::string_view message, std::initializer_list<LogField> fields = {}) {
  if (log_enabled(LogLevel::debug)) log(LogLevel::debug, message, fields);
}
inline void log_info(std::string_view message, std::initializer_list<LogField> fields = {}) {
  log(LogLevel::info, message, fields);
}
inline void log_warning(std::string_view message, std::initializer_list<LogField> fields = {}) {
  log(LogLevel::warning, message, fields);
}
inline void log_error(std::string_view message, std::initializer_list<LogField> fields = {}) {
  log(LogLevel::error, message, fields);
}

// A line whose message is printf-formatted (no fields): for the lines of actors that
// already say it all in their words.
void logf(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

// The line `log` writes after its timestamp, for tests: `LEVEL message k=v ...` as text,
// or the object's members (`"level":...,"message":...,"k":v`) as JSON.
std::string render_log_body(LogFormat format, LogLevel level, std::string_view message,
                            std::span<const LogField> fields);

}  // namespace troupe::monitoring
