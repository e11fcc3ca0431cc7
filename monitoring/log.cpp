#include "monitoring/log.hpp"

#include <spdlog/async.h>
#include <spdlog/async_logger.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

namespace troupe::monitoring {

namespace {

// Lines queued for the writer; past this the oldest is dropped (never blocks the caller).
constexpr std::size_t kQueueLines = 8192;

std::atomic<int> g_level{static_cast<int>(LogLevel::info)};
std::atomic<int> g_format{static_cast<int>(LogFormat::text)};

// The logger lines go to: read without a lock on every line, replaced by configure_logging.
std::atomic<std::shared_ptr<spdlog::logger>>& writer() {
  static std::atomic<std::shared_ptr<spdlog::logger>> logger;
  return logger;
}
std::mutex& configuring() {
  static std::mutex mutex;
  return mutex;
}

std::string_view level_word(LogLevel level, LogFormat format) {
  const bool text = format == LogFormat::text;
  switch (level) {
    case LogLevel::debug:
      return text ? "DEBUG" : "debug";
    case LogLevel::info:
      return text ? "INFO" : "info";
    case LogLevel::warning:
      return text ? "WARNING" : "warning";
    case LogLevel::error:
      return text ? "ERROR" : "error";
    case LogLevel::off:
      break;
  }
  return "";
}

// The length of the valid UTF-8 sequence at text[i], or 0 when it is not one.
std::size_t utf8_sequence(std::string_view text, std::size_t i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  std::size_t n = lead < 0x80                   ? 1
                  : lead >= 0xF0 && lead < 0xF5 ? 4
                  : lead >= 0xE0                ? 3
                  : lead >= 0xC2 && lead < 0xE0 ? 2
                                                : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// Control bytes and invalid UTF-8 become escapes: what a client sent (a path, a model
// name) cannot forge a line or break the JSON.
void append_escaped(std::string& out, std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", c);
      out += escape;
    } else if (c >= 0x80) {
      const std::size_t n = utf8_sequence(text, i);
      if (n == 0) {
        out += "\\ufffd";
        ++i;
        continue;
      }
      out.append(text.substr(i, n));
      i += n;
      continue;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
}

bool needs_quotes(std::string_view text) {
  return text.empty() || std::any_of(text.begin(), text.end(), [](char ch) {
           const auto c = static_cast<unsigned char>(ch);
           return c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7F;
         });
}

void append_number(std::string& out, double value, bool json) {
  if (!std::isfinite(value)) {
    out += json ? "null" : (std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf");
    return;
  }
  char digits[32];
  std::snprintf(digits, sizeof digits, "%.6g", value);
  out += digits;
}

void append_value(std::string& out, const LogField::Value& value, bool json) {
  if (std::holds_alternative<std::monostate>(value)) {
    out += json ? "null" : "-";
  } else if (const auto* text = std::get_if<std::string_view>(&value)) {
    const bool quoted = json || needs_quotes(*text);
    if (quoted) out += '"';
    append_escaped(out, *text);
    if (quoted) out += '"';
  } else if (const auto* integer = std::get_if<std::int64_t>(&value)) {
    out += std::to_string(*integer);
  } else if (const auto* real = std::get_if<double>(&value)) {
    append_number(out, *real, json);
  } else {
    out += std::get<bool>(value) ? "true" : "false";
  }
}

std::shared_ptr<spdlog::logger> make_logger(LogFormat format) {
  if (!spdlog::thread_pool()) spdlog::init_thread_pool(kQueueLines, 1);
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger =
      std::make_shared<spdlog::async_logger>("troupe", std::move(sink), spdlog::thread_pool(),
                                             spdlog::async_overflow_policy::overrun_oldest);
  // The body (level, message, fields) is rendered by render_log_body; spdlog adds the time.
  const char* pattern = format == LogFormat::json ? R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ",%v})"
                                                  : "%Y-%m-%dT%H:%M:%S.%eZ %v";
  logger->set_formatter(
      std::make_unique<spdlog::pattern_formatter>(pattern, spdlog::pattern_time_type::utc));
  logger->set_level(spdlog::level::trace);
  logger->flush_on(spdlog::level::trace);
  return logger;
}

std::shared_ptr<spdlog::logger> current_logger() {
  if (auto logger = writer().load()) return logger;
  std::lock_guard lock(configuring());
  auto logger = writer().load();
  if (!logger) {
    logger = make_logger(static_cast<LogFormat>(g_format.load()));
    writer().store(logger);
  }
  return logger;
}

// Waits (a second at most) until the writer has written what was queued.
void drain() {
  const auto pool = spdlog::thread_pool();
  if (!pool) return;
  for (int i = 0; i < 1000 && pool->queue_size() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "debug") return LogLevel::debug;
  if (lower == "info") return LogLevel::info;
  if (lower == "warning" || lower == "warn") return LogLevel::warning;
  if (lower == "error") return LogLevel::error;
  if (lower == "off") return LogLevel::off;
  return std::nullopt;
}

std::optional<LogFormat> parse_log_format(std::string_view name) {
  if (name == "text") return LogFormat::text;
  if (name == "json") return LogFormat::json;
  return std::nullopt;
}

void configure_logging(LogLevel level, LogFormat format) {
  std::lock_guard lock(configuring());
  g_level = static_cast<int>(level);
  g_format = static_cast<int>(format);
  drain();  // what was queued goes out in the old format, before the new one
  writer().store(make_logger(format));
}

void flush_logging() {
  // The writer thread stays (it is joined at exit, after writing what is left): a line
  // logged later still goes out.
  if (auto logger = writer().load()) logger->flush();
  drain();
}

bool log_enabled(LogLevel level) {
  return level != LogLevel::off &&
         static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

std::string render_log_body(LogFormat format, LogLevel level, std::string_view message,
                            std::span<const LogField> fields) {
  std::string out;
  out.reserve(64 + message.size() + 24 * fields.size());
  if (format == LogFormat::json) {
    out += R"("level":")";
    out += level_word(level, format);
    out += R"(","message":")";
    append_escaped(out, message);
    out += '"';
    for (const auto& field : fields) {
      out += ",\"";
      append_escaped(out, field.key);
      out += "\":";
      append_value(out, field.value, true);
    }
    return out;
  }
  const auto word = level_word(level, format);
  out += word;
  out.append(word.size() < 7 ? 8 - word.size() : 1, ' ');
  append_escaped(out, message);
  for (const auto& field : fields) {
    out += ' ';
    out += field.key;
    out += '=';
    append_value(out, field.value, false);
  }
  return out;
}

void log(LogLevel level, std::string_view message, std::span<const LogField> fields) {
  if (!log_enabled(level)) return;
  const auto format = static_cast<LogFormat>(g_format.load(std::memory_order_relaxed));
  const auto body = render_log_body(format, level, message, fields);
  current_logger()->log(spdlog::level::info, spdlog::string_view_t(body.data(), body.size()));
}

void logf(LogLevel level, const char* format, ...) {
  if (!log_enabled(level)) return;
  std::va_list args;
  va_start(args, format);
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string message(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(message.data(), message.size() + 1, format, again);
  va_end(again);
  log(level, message);
}

}  // namespace troupe::monitoring
