// The HTTP layer without sockets: how a request is read (limits, and the answer to one
// that cannot be read), who may call which route, and the answers of the plain routes.
// The server's connections use it, and so does the fuzz target, byte for byte.
#pragma once

#include <boost/beast/http.hpp>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "net/cluster_json.hpp"
#include "net/http_server.hpp"
#include "net/openai_api.hpp"

namespace troupe::net {

namespace http = boost::beast::http;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;
using RequestParser = http::request_parser<http::string_body>;

// The parser's limits: the header section, and the body (413 past it).
void configure_parser(RequestParser& parser, const ServerConfig& config);
// The most bytes a connection buffers that the parser has not taken yet: a header
// section, a chunk's size line or a chunked body's trailers. Trailers are held to the
// header limit by this cap (Beast parses them only once they are all buffered).
std::size_t max_unparsed_bytes(const ServerConfig& config);

// The answer to a request that could not be read: 400 (malformed), 413 (body too
// large), 431 (header section or trailers too large). None when the client went away
// or was too slow: there is no one to answer.
std::optional<ApiError> read_error(const boost::system::error_code& ec, const ServerConfig& config);

// Who answers a request, by its path and method (the server's one table of routes).
enum class RouteKind {
  none,             // no such route, or not with this method: route() says 404 or 405
  plain,            // route(), on the connection's thread
  heavy,            // route(), off the connection's thread: tokenizing, a look at the engine
  completion,       // POST /v1/completions: the engine answers, not route()
  chat_completion,  // POST /v1/chat/completions: the engine answers, not route()
  responses,        // POST /v1/responses: the engine answers, not route()
  websocket,        // GET /v1/ws: the upgrade to a socket
  engine_events,    // GET /v1/engine/events: the steps as server-sent events
};
RouteKind route_kind(const Request& request);

// The request's path, without its query.
std::string_view request_path(const Request& request);
// The route label for troupe_http_requests_total: a known route by name, else "other".
std::string_view route_label(std::string_view path);
// Whether the request carries the API key ("Authorization: Bearer <key>"), or none is set.
// A WebSocket upgrade may carry it as a subprotocol instead, since a browser's socket
// cannot send headers: "troupe.bearer.<the key in unpadded base64url>".
bool is_authorized(const Request& request, const ServerConfig& config);
// The subprotocol a WebSocket upgrade's answer names: "troupe" when offered, else the
// bearer entry (a browser fails a socket whose answer names none it offered); empty
// when the request offered none.
std::string chosen_subprotocol(const Request& request);
// The 401 for a request that needs the API key (anything under /v1/, /tokenize,
// /detokenize) and does not carry it; none when it may go on.
std::optional<ApiError> missing_api_key(const Request& request, const ServerConfig& config);
// POST /v1/completions, /v1/chat/completions or /v1/responses: answered by the engine,
// not route().
bool is_generation(const Request& request);
// Routes whose answer takes real work (tokenizing, a look at the engine): they run off
// the connection's thread.
bool is_heavy(const Request& request);

Response make_response(const Request& request, http::status status, std::string body,
                       std::string_view content_type = "application/json");
Response error_response(const Request& request, const ApiError& error);

struct RouteContext {
  const ServerConfig* config = nullptr;
  const ApiContext* api = nullptr;
  // The Prometheus exposition; empty: /metrics is a 404.
  std::function<std::string()> metrics_text;
  // Replicas up, there, and their range, for /health (503 at none up); empty: always healthy.
  std::function<ReplicaCount()> replicas_up;
  // GET /v1/cluster's body: nodes and replicas; empty: a 404.
  std::function<std::string()> cluster_json;
  // Whether the server drains (/health answers 503 then); empty: never.
  std::function<bool()> draining;
  // POST /v1/admin/drain: starts the drain (once) and says what is left; empty: a 404.
  std::function<std::string()> start_drain;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's): the path and the
  // body in; the plain-text success, or the error. Empty: both are 404s.
  std::function<tl::expected<std::string, ApiError>(std::string_view path, std::string_view body)>
      lora_admin;
  // POST /v1/cluster/nodes/{name}/drain: drains a cluster's node; empty: a 404.
  std::function<NodeDrain(const std::string& name)> drain_node;
};

// Every route but generation, the event stream and the WebSocket upgrade: CORS
// preflights, the built-in page (GET / and its files, no key needed), the API key,
// /health, /version, /metrics, /v1/models, /tokenize, /detokenize, /v1/admin/drain,
// /v1/load_lora_adapter, /v1/unload_lora_adapter, 404 and 405.
Response route(const Request& request, const RouteContext& context);

}  // namespace troupe::net
