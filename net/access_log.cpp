// The server's access log (a line per request), its counts of responses, and its
// rate-limited warnings.
#include "monitoring/log.hpp"
#include "net/server_impl.hpp"

namespace troupe::net {

void AccessEntry::ended(const TokenEvent& end, std::string_view reason) {
  output_tokens = std::max<std::int64_t>(output_tokens, 0) + end.num_generated_tokens;
  if (finish_reason.empty()) {
    finish_reason = reason;
  } else if (finish_reason.find(reason) == std::string::npos) {
    finish_reason += ",";
    finish_reason += reason;
  }
}

void HttpServer::Impl::count(const Request& request, int status, AccessEntry& entry) {
  entry.status = status;
  if (config.metrics) config.metrics->count_http(route_label(request_path(request)), status);
}

bool HttpServer::Impl::access_logged() const {
  return config.access_log && monitoring::log_enabled(monitoring::LogLevel::info);
}

void HttpServer::Impl::log_access(const Request& request, const AccessEntry& e,
                                  std::string_view client) const {
  log_access(request.method_string(), request_path(request), e, client);
}

void HttpServer::Impl::log_access(std::string_view method, std::string_view full_path,
                                  const AccessEntry& e, std::string_view client) const {
  if (!access_logged()) return;
  // A path or an id is the client's to choose: keep a line a line.
  constexpr std::size_t kMostClientBytes = 256;
  const std::string_view path = full_path.substr(0, kMostClientBytes);
  const std::string_view request_id = std::string_view(e.request_id).substr(0, kMostClientBytes);
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - e.start).count();
  using monitoring::LogField;
  const auto count_or_none = [](std::string_view key, std::int64_t n) {
    return n < 0 ? LogField(key, nullptr) : LogField(key, n);
  };
  // A refusal says why (its error's message, bounded as the client's text is).
  const std::string_view error = std::string_view(e.error).substr(0, kMostClientBytes);
  const LogField fields[] = {
      {"method", method},
      {"path", path},
      {"status", e.status},
      request_id.empty() ? LogField("request_id", nullptr) : LogField("request_id", request_id),
      count_or_none("prompt_tokens", e.prompt_tokens),
      count_or_none("output_tokens", e.output_tokens),
      e.ttft_seconds ? LogField("ttft_ms", *e.ttft_seconds * 1e3) : LogField("ttft_ms", nullptr),
      {"total_ms", total * 1e3},
      e.finish_reason.empty() ? LogField("finish_reason", nullptr)
                              : LogField("finish_reason", e.finish_reason),
      {"client_gone", e.client_gone},
      {"client", client},
      {"error", error},
  };
  // The reason only on a refusal's line: a served request's line is as it was.
  const std::size_t num_fields = std::size(fields) - (e.status >= 400 && !error.empty() ? 0 : 1);
  monitoring::log(monitoring::LogLevel::info, "request",
                  std::span<const monitoring::LogField>(fields, num_fields));
}

void HttpServer::Impl::warn(const std::string& message) {
  std::lock_guard lock(warn_mutex);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_warning < std::chrono::seconds(1)) {
    ++num_suppressed_warnings;
    return;
  }
  last_warning = now;
  if (num_suppressed_warnings > 0) {
    monitoring::log_warning(message, {{"suppressed_in_last_second", num_suppressed_warnings}});
  } else {
    monitoring::log_warning(message);
  }
  num_suppressed_warnings = 0;
}

void HttpServer::Impl::on_session_exception(std::exception_ptr error) {
  if (!error) return;
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  if (config.metrics) config.metrics->count_connection_error("exception");
  warn("a connection ended on an exception (" + what + "); the server goes on");
}
}  // namespace troupe::net
