// Cross-origin requests from browsers (CORS), with vLLM's flags and defaults: any origin,
// method and header is allowed unless --allowed-origins, --allowed-methods or
// --allowed-headers narrow it. A preflight (OPTIONS with Origin and
// Access-Control-Request-Method) is answered before the API key is asked for, as
// browsers send none with it; every other answer to a request with an Origin carries the
// Access-Control-Allow-* headers it needs. No sockets here.
#pragma once

#include <boost/beast/http/fields.hpp>
#include <string>
#include <vector>

#include "net/http_routes.hpp"

namespace troupe::net {

// A preflight request: OPTIONS with an Origin and an Access-Control-Request-Method.
bool is_cors_preflight(const Request& request);
// 200 with the Access-Control-Allow-* headers, or 400 naming what was disallowed.
Response cors_preflight_response(const Request& request, const CorsConfig& cors);
// The headers an answer to a cross-origin request carries, X-Request-Id exposed to the
// page among them (none without an Origin, or for an origin not allowed: the browser then
// withholds the answer from the page).
void add_cors_headers(const Request& request, http::fields& response, const CorsConfig& cors);
// Whether a request's Origin (if it has one) is allowed: a browser applies no CORS to a
// WebSocket, so the server refuses an upgrade from an origin not allowed (403) itself.
bool is_allowed_origin(const Request& request, const CorsConfig& cors);

}  // namespace troupe::net
