#include "net/http_routes.hpp"

#include <array>

namespace troupe::net {

namespace {

constexpr std::array<std::string_view, 9> kRoutes = {
    "/health",   "/version",    "/metrics",        "/v1/models",
    "/tokenize", "/detokenize", "/v1/completions", "/v1/chat/completions",
    "/v1/ws"};

bool is_post(const Request& request, std::string_view path) {
  return request.method() == http::verb::post && request_path(request) == path;
}

}  // namespace

void configure_parser(RequestParser& parser, const ServerConfig& config) {
  parser.header_limit(static_cast<std::uint32_t>(config.max_header_bytes));
  parser.body_limit(config.max_body_bytes);
}

std::size_t max_unparsed_bytes(const ServerConfig& config) {
  return config.max_header_bytes;
}

std::optional<ApiError> read_error(const boost::system::error_code& ec,
                                   const ServerConfig& config) {
  if (ec == http::error::end_of_stream || ec == http::error::partial_message) return {};
  if (ec == http::error::body_limit) {
    return ApiError{
        413, "the request body is larger than " + std::to_string(config.max_body_bytes) + " bytes",
        "invalid_request_error", ""};
  }
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    return ApiError{431,
                    "the request's header section (or a chunked body's trailers) is larger than " +
                        std::to_string(config.max_header_bytes) + " bytes",
                    "invalid_request_error", ""};
  }
  if (ec.category() == make_error_code(http::error::bad_method).category()) {
    return ApiError{400, "malformed HTTP request: " + ec.message(), "invalid_request_error", ""};
  }
  return {};  // reset, timed out, closed
}

std::string_view request_path(const Request& request) {
  const std::string_view target = request.target();
  return target.substr(0, target.find('?'));
}

std::string_view route_label(std::string_view path) {
  for (std::string_view r : kRoutes) {
    if (path == r) return r;
  }
  return "other";
}

bool is_authorized(const Request& request, const ServerConfig& config) {
  return config.api_key.empty() ||
         request[http::field::authorization] == "Bearer " + config.api_key;
}

bool is_generation(const Request& request) {
  return is_post(request, "/v1/completions") || is_post(request, "/v1/chat/completions");
}

bool is_heavy(const Request& request) {
  return is_post(request, "/tokenize") || is_post(request, "/detokenize") ||
         (request.method() == http::verb::get && request_path(request) == "/metrics");
}

Response make_response(const Request& request, http::status status, std::string body,
                       std::string_view content_type) {
  Response res{status, request.version()};
  res.set(http::field::server, "troupe");
  res.set(http::field::content_type, content_type);
  res.keep_alive(request.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

Response error_response(const Request& request, const ApiError& error) {
  return make_response(request, static_cast<http::status>(error.status), error_json(error));
}

Response route(const Request& request, const RouteContext& context) {
  const ServerConfig& config = *context.config;
  const std::string path(request_path(request));
  const bool get = request.method() == http::verb::get;
  const bool post = request.method() == http::verb::post;
  auto ok = [&](std::string body) {
    return make_response(request, http::status::ok, std::move(body));
  };
  auto fail = [&](const ApiError& error) { return error_response(request, error); };
  // The key guards every route that reads the model or runs work: /v1 and the tokenizer.
  const bool guarded = path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize";
  if (guarded && !is_authorized(request, config)) {
    return fail(ApiError{401, "invalid or missing API key (Authorization: Bearer ...)",
                         "authentication_error", ""});
  }
  if (path == "/health" && get) return ok("");
  if (path == "/metrics" && get && context.metrics_text) {
    return make_response(request, http::status::ok, context.metrics_text(),
                         "text/plain; version=0.0.4");
  }
  if (path == "/version" && get) return ok(R"({"version":"0.1.0"})");
  if (path == "/v1/models" && get) return ok(models_response(*context.api));
  if (path == "/tokenize" && post) {
    auto body = tokenize_response(request.body(), *context.api);
    return body ? ok(std::move(*body)) : fail(body.error());
  }
  if (path == "/detokenize" && post) {
    auto body = detokenize_response(request.body(), *context.api);
    return body ? ok(std::move(*body)) : fail(body.error());
  }
  const bool known = route_label(path) != "other" && path != "/v1/ws" &&
                     (path != "/metrics" || context.metrics_text);
  if (known) {
    return fail(ApiError{
        405, "method " + std::string(request.method_string()) + " is not allowed on " + path,
        "invalid_request_error", ""});
  }
  return fail(ApiError{404, "no route " + path, "NotFoundError", ""});
}

}  // namespace troupe::net
