#include "net/http_routes.hpp"

#include <algorithm>
#include <array>
#include <boost/json.hpp>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include "net/cors.hpp"
#include "net/web_assets.hpp"

namespace troupe::net {

namespace {

Response ok(const Request& request, std::string body) {
  return make_response(request, http::status::ok, std::move(body));
}

// The answer of a route that route() serves.
using Answer = Response (*)(const Request& request, const RouteContext& context);

// A JSON body, or the client's error.
// A path segment with its %XX escapes decoded (a model named "org/model" arrives as
// "org%2Fmodel" from clients that escape it); a malformed escape stays as written.
std::string percent_decoded(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() &&
        std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

Response json_answer(const Request& request, tl::expected<std::string, ApiError> body) {
  return body ? ok(request, std::move(*body)) : error_response(request, body.error());
}

Response lora_admin_answer(const Request& request, const RouteContext& context) {
  auto answer = context.lora_admin(request_path(request), request.body());
  if (!answer) return error_response(request, answer.error());
  return make_response(request, http::status::ok, std::move(*answer), "text/plain; charset=utf-8");
}

struct RouteSpec {
  std::string_view path;
  http::verb method;
  RouteKind kind;
  bool needs_key;  // the API key guards what reads the model or runs work
  Answer answer;   // null where the server answers: generation and the socket
};

// Every route the server knows, once. Paths under /v1/ that are not here need the key
// as well (401 before 404).
constexpr std::array<RouteSpec, 15> kRoutes = {{
    {"/health", http::verb::get, RouteKind::plain, false,
     [](const Request& request, const RouteContext& context) {
       // A draining server asks its load balancer to send no more (and says why).
       if (context.draining && context.draining()) {
         return make_response(request, http::status::service_unavailable,
                              R"({"status":"draining"})");
       }
       if (!context.replicas_up) return ok(request, "");
       const ReplicaCount count = context.replicas_up();
       return make_response(request,
                            count.up > 0 ? http::status::ok : http::status::service_unavailable,
                            health_json(count));
     }},
    {"/version", http::verb::get, RouteKind::plain, false,
     [](const Request& request, const RouteContext&) {
       return ok(request, R"({"version":")" TROUPE_VERSION R"("})");
     }},
    {"/metrics", http::verb::get, RouteKind::heavy, false,
     [](const Request& request, const RouteContext& context) {
       return make_response(request, http::status::ok, context.metrics_text(),
                            "text/plain; version=0.0.4");
     }},
    {"/v1/models", http::verb::get, RouteKind::plain, true,
     [](const Request& request, const RouteContext& context) {
       return ok(request, models_response(*context.api));
     }},
    {"/tokenize", http::verb::post, RouteKind::heavy, true,
     [](const Request& request, const RouteContext& context) {
       return json_answer(request, tokenize_response(request.body(), *context.api));
     }},
    {"/detokenize", http::verb::post, RouteKind::heavy, true,
     [](const Request& request, const RouteContext& context) {
       return json_answer(request, detokenize_response(request.body(), *context.api));
     }},
    {"/v1/cluster", http::verb::get, RouteKind::heavy, true,
     [](const Request& request, const RouteContext& context) {
       return ok(request, context.cluster_json());
     }},
    {"/v1/completions", http::verb::post, RouteKind::completion, true, nullptr},
    {"/v1/chat/completions", http::verb::post, RouteKind::chat_completion, true, nullptr},
    {"/v1/responses", http::verb::post, RouteKind::responses, true, nullptr},
    {"/v1/ws", http::verb::get, RouteKind::websocket, true, nullptr},
    {"/v1/engine/events", http::verb::get, RouteKind::engine_events, true, nullptr},
    // The drain SIGTERM starts, asked over HTTP (behind the key when one is set): 202.
    {"/v1/admin/drain", http::verb::post, RouteKind::plain, true,
     [](const Request& request, const RouteContext& context) {
       return make_response(request, http::status::accepted, context.start_drain());
     }},
    // Run-time LoRA adapters (vLLM's routes and answers): heavy, a load reads the file.
    {"/v1/load_lora_adapter", http::verb::post, RouteKind::heavy, true, lora_admin_answer},
    {"/v1/unload_lora_adapter", http::verb::post, RouteKind::heavy, true, lora_admin_answer},
}};

const RouteSpec* find_route(std::string_view path) {
  const auto* found = std::find_if(kRoutes.begin(), kRoutes.end(),
                                   [path](const RouteSpec& r) { return r.path == path; });
  return found == kRoutes.end() ? nullptr : found;
}

// Whether route() answers this path at all (404 otherwise): the socket is reached by an
// upgrade alone, and /metrics only when there are metrics to serve.
bool is_routed(const RouteSpec& r, const RouteContext& context) {
  return r.kind != RouteKind::websocket && (r.path != "/metrics" || context.metrics_text) &&
         (r.path != "/v1/cluster" || context.cluster_json) &&
         (r.path != "/v1/admin/drain" || context.start_drain) &&
         (!r.path.ends_with("_lora_adapter") || context.lora_admin);
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

RouteKind route_kind(const Request& request) {
  const RouteSpec* r = find_route(request_path(request));
  return r != nullptr && r->method == request.method() ? r->kind : RouteKind::none;
}

std::string_view route_label(std::string_view path) {
  if (path == "/") return "/";
  const RouteSpec* r = find_route(path);
  if (r == nullptr && is_web_file_path(path)) return "/{file}";
  if (r == nullptr && path.starts_with("/v1/models/")) return "/v1/models/{model}";
  if (r == nullptr && path.starts_with("/v1/cluster/nodes/")) return "/v1/cluster/nodes/{name}";
  return r != nullptr ? r->path : "other";
}

namespace {

constexpr std::string_view kBearerProtocol = "troupe.bearer.";

// The entries of a comma-separated header, trimmed.
std::vector<std::string_view> header_list(std::string_view value) {
  std::vector<std::string_view> items;
  while (!value.empty()) {
    const std::size_t comma = value.find(',');
    std::string_view item = value.substr(0, comma);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (!item.empty()) items.push_back(item);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return items;
}

// Unpadded base64url (RFC 4648 section 5); none when a character is outside it.
std::optional<std::string> decode_base64url(std::string_view text) {
  std::string out;
  std::uint32_t bits = 0;
  int num_bits = 0;
  for (const char c : text) {
    int v = -1;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    if (c >= '0' && c <= '9') v = c - '0' + 52;
    if (c == '-') v = 62;
    if (c == '_') v = 63;
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<std::uint32_t>(v);
    num_bits += 6;
    if (num_bits >= 8) {
      num_bits -= 8;
      out.push_back(static_cast<char>((bits >> num_bits) & 0xff));
    }
  }
  return out;
}

bool offers_key(const Request& request, const std::string& key) {
  for (std::string_view p : header_list(request[http::field::sec_websocket_protocol])) {
    if (!p.starts_with(kBearerProtocol)) continue;
    if (decode_base64url(p.substr(kBearerProtocol.size())) == key) return true;
  }
  return false;
}

}  // namespace

bool is_authorized(const Request& request, const ServerConfig& config) {
  if (config.api_key.empty() || request[http::field::authorization] == "Bearer " + config.api_key) {
    return true;
  }
  return route_kind(request) == RouteKind::websocket && offers_key(request, config.api_key);
}

std::string chosen_subprotocol(const Request& request) {
  const auto offered = header_list(request[http::field::sec_websocket_protocol]);
  if (std::find(offered.begin(), offered.end(), "troupe") != offered.end()) return "troupe";
  for (std::string_view p : offered) {
    if (p.starts_with(kBearerProtocol)) return std::string(p);
  }
  return offered.empty() ? "" : std::string(offered.front());
}

std::optional<ApiError> missing_api_key(const Request& request, const ServerConfig& config) {
  const std::string_view path = request_path(request);
  const RouteSpec* r = find_route(path);
  const bool needs_key = path.starts_with("/v1/") || (r != nullptr && r->needs_key);
  if (!needs_key || is_authorized(request, config)) return {};
  return ApiError{401, "invalid or missing API key (Authorization: Bearer ...)",
                  "authentication_error", ""};
}

bool is_generation(const Request& request) {
  const RouteKind kind = route_kind(request);
  return kind == RouteKind::completion || kind == RouteKind::chat_completion ||
         kind == RouteKind::responses;
}

bool is_heavy(const Request& request) {
  return route_kind(request) == RouteKind::heavy;
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
  Response res = make_response(request, static_cast<http::status>(error.status), error_json(error));
  if (error.retry_after_s > 0)
    res.set(http::field::retry_after, std::to_string(error.retry_after_s));
  return res;
}

namespace {

// What the page may do in a browser: its own scripts and styles, and calls to this
// server only (the socket included); nothing inline, nothing from elsewhere.
constexpr std::string_view kPagePolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

// Whether an If-None-Match header names the tag: a list, weak tags compared weakly
// (RFC 9110 13.1.2), "*" for any.
bool etag_matches(std::string_view if_none_match, std::string_view etag) {
  for (std::string_view tag : header_list(if_none_match)) {
    if (tag == "*") return true;
    if (tag.starts_with("W/")) tag.remove_prefix(2);
    if (tag == etag) return true;
  }
  return false;
}

// The built-in page's file for a GET or HEAD of it; none for any other request.
std::optional<Response> page_file(const Request& request, const ServerConfig& config) {
  const bool head = request.method() == http::verb::head;
  if (!config.web_page || (request.method() != http::verb::get && !head)) return std::nullopt;
  auto file = find_web_file(request_path(request), config.web_dir);
  if (!file) return std::nullopt;
  const bool unchanged = etag_matches(request[http::field::if_none_match], file->etag);
  const std::size_t length = file->body.size();
  Response res = make_response(request, unchanged ? http::status::not_modified : http::status::ok,
                               unchanged || head ? "" : std::move(file->body), file->content_type);
  res.set(http::field::etag, file->etag);
  res.set(http::field::cache_control, "no-cache");  // asked again after an upgrade: the tag
  res.set("Content-Security-Policy", kPagePolicy);
  res.set("X-Content-Type-Options", "nosniff");
  res.set("Referrer-Policy", "no-referrer");
  if (unchanged) {
    res.erase(http::field::content_length);  // a 304's length would be the 200's, not 0
    res.erase(http::field::content_type);
  } else if (head) {
    res.content_length(length);  // the GET's length, without the body
  }
  return res;
}

// POST /v1/cluster/nodes/{name}/drain: 202 as the drain starts, 409 when it drains
// already, 404 for a node the head does not know; none for another path.
std::optional<Response> node_drain(const Request& request, const std::string& path,
                                   const RouteContext& context) {
  constexpr std::string_view kNodes = "/v1/cluster/nodes/";
  constexpr std::string_view kDrain = "/drain";
  if (!path.starts_with(kNodes) || !path.ends_with(kDrain) ||
      path.size() <= kNodes.size() + kDrain.size()) {
    return std::nullopt;
  }
  if (request.method() != http::verb::post) {
    return error_response(request, ApiError{405,
                                            "method " + std::string(request.method_string()) +
                                                " is not allowed on " + path,
                                            "invalid_request_error", ""});
  }
  const std::string name = percent_decoded(
      std::string_view(path).substr(kNodes.size(), path.size() - kNodes.size() - kDrain.size()));
  switch (context.drain_node(name)) {
    case NodeDrain::started: {
      const boost::json::object answer{{"node", name}, {"status", "draining"}};
      return make_response(request, http::status::accepted, boost::json::serialize(answer));
    }
    case NodeDrain::already:
      return error_response(
          request, ApiError{409, "node '" + name + "' is draining already", "ConflictError", ""});
    case NodeDrain::unknown:
      break;
  }
  return error_response(
      request, ApiError{404, "no node named '" + name + "' in the cluster", "NotFoundError", ""});
}

}  // namespace

Response route(const Request& request, const RouteContext& context) {
  // Before the key: a browser's preflight carries none, nor does a load of the page (it
  // asks for the key).
  if (is_cors_preflight(request)) return cors_preflight_response(request, context.config->cors);
  if (auto page = page_file(request, *context.config)) return std::move(*page);
  if (auto refused = missing_api_key(request, *context.config)) {
    return error_response(request, *refused);
  }
  const std::string path(request_path(request));
  const RouteSpec* r = find_route(path);
  // GET /v1/models/{model}: the one route with a parameter (the name may hold '/').
  constexpr std::string_view kModel = "/v1/models/";
  if (r == nullptr && path.starts_with(kModel) && path.size() > kModel.size()) {
    if (request.method() != http::verb::get) {
      return error_response(request, ApiError{405,
                                              "method " + std::string(request.method_string()) +
                                                  " is not allowed on " + path,
                                              "invalid_request_error", ""});
    }
    return json_answer(request,
                       model_response(*context.api, percent_decoded(path.substr(kModel.size()))));
  }
  if (r == nullptr && context.drain_node) {
    if (auto drained = node_drain(request, path, context)) return std::move(*drained);
  }
  if (r == nullptr || !is_routed(*r, context)) {
    return error_response(request, ApiError{404, "no route " + path, "NotFoundError", ""});
  }
  if (r->method != request.method() || r->answer == nullptr) {
    return error_response(request, ApiError{405,
                                            "method " + std::string(request.method_string()) +
                                                " is not allowed on " + path,
                                            "invalid_request_error", ""});
  }
  return r->answer(request, context);
}

}  // namespace troupe::net
