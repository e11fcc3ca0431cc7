// CORS: preflights answered before the API key, and the headers browsers need on answers,
// with vLLM's defaults (everything allowed) and with narrowed lists.
#include <catch2/catch.hpp>

#include "net/cors.hpp"
#include "net/http_routes.hpp"
#include "net/http_server.hpp"

using namespace troupe::net;

namespace {

Request preflight(std::string origin, std::string method, std::string headers = "") {
  Request r{http::verb::options, "/v1/chat/completions", 11};
  r.set(http::field::origin, origin);
  r.set(http::field::access_control_request_method, method);
  if (!headers.empty()) r.set(http::field::access_control_request_headers, headers);
  return r;
}

std::string header(const Response& r, http::field f) {
  const auto it = r.find(f);
  return it == r.end() ? "<none>" : std::string(it->value());
}

}  // namespace

TEST_CASE("a preflight is answered before the API key is asked for", "[net][cors]") {
  ServerConfig config;
  config.api_key = "sk-secret";
  RouteContext context;
  context.config = &config;
  const Request r = preflight("https://app.example", "POST", "authorization, content-type");
  REQUIRE(is_cors_preflight(r));
  const Response answer = route(r, context);
  CHECK(answer.result_int() == 200);
  CHECK(header(answer, http::field::access_control_allow_origin) == "*");
  CHECK(header(answer, http::field::access_control_allow_methods) ==
        "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  CHECK(header(answer, http::field::access_control_allow_headers) == "authorization, content-type");
  CHECK(header(answer, http::field::access_control_max_age) == "600");

  SECTION("an OPTIONS that is no preflight is still a 405 (or the key's 401)") {
    Request plain{http::verb::options, "/health", 11};
    CHECK_FALSE(is_cors_preflight(plain));
    CHECK(route(plain, context).result_int() == 405);
  }
}

TEST_CASE("narrowed lists refuse what they do not name", "[net][cors]") {
  CorsConfig cors;
  cors.allowed_origins = {"https://app.example"};
  cors.allowed_methods = {"GET", "POST"};
  cors.allowed_headers = {"Authorization"};

  const Response ok =
      cors_preflight_response(preflight("https://app.example", "post", "Authorization"), cors);
  CHECK(ok.result_int() == 200);
  CHECK(header(ok, http::field::access_control_allow_origin) == "https://app.example");
  CHECK(header(ok, http::field::vary) == "Origin");
  CHECK(header(ok, http::field::access_control_allow_methods) == "GET, POST");
  CHECK(header(ok, http::field::access_control_allow_headers) ==
        "accept, accept-language, content-language, content-type, Authorization");

  const Response origin = cors_preflight_response(preflight("https://evil.example", "POST"), cors);
  CHECK(origin.result_int() == 400);
  CHECK(origin.body() == "Disallowed CORS origin");
  const Response method = cors_preflight_response(preflight("https://app.example", "DELETE"), cors);
  CHECK(method.body() == "Disallowed CORS method");
  const Response headers =
      cors_preflight_response(preflight("https://app.example", "POST", "X-Custom"), cors);
  CHECK(headers.body() == "Disallowed CORS headers");
  // Safelisted headers need no naming.
  CHECK(cors_preflight_response(preflight("https://app.example", "POST", "Content-Type"), cors)
            .result_int() == 200);
}

TEST_CASE("an answer to a cross-origin request carries the origin it may be read from",
          "[net][cors]") {
  Request r{http::verb::get, "/v1/models", 11};
  Response answer{http::status::ok, 11};
  CorsConfig any;
  add_cors_headers(r, answer, any);
  CHECK(header(answer, http::field::access_control_allow_origin) == "<none>");  // no Origin

  r.set(http::field::origin, "https://app.example");
  add_cors_headers(r, answer, any);
  CHECK(header(answer, http::field::access_control_allow_origin) == "*");
  // The page may read the request's id (X-Request-Id), as vLLM's clients do.
  CHECK(header(answer, http::field::access_control_expose_headers) == "X-Request-Id");

  SECTION("with credentials the origin is named, never *") {
    CorsConfig credentials;
    credentials.allow_credentials = true;
    Response named{http::status::ok, 11};
    add_cors_headers(r, named, credentials);
    CHECK(header(named, http::field::access_control_allow_origin) == "https://app.example");
    CHECK(header(named, http::field::access_control_allow_credentials) == "true");
    CHECK(header(named, http::field::vary) == "Origin");
  }
  SECTION("an origin not allowed gets no header: the browser withholds the answer") {
    CorsConfig narrow;
    narrow.allowed_origins = {"https://other.example"};
    Response withheld{http::status::ok, 11};
    add_cors_headers(r, withheld, narrow);
    CHECK(header(withheld, http::field::access_control_allow_origin) == "<none>");
    CHECK(header(withheld, http::field::access_control_expose_headers) == "<none>");
    CHECK(header(withheld, http::field::vary) == "Origin");  // caches keep origins apart
    CHECK_FALSE(is_allowed_origin(r, narrow));
    CHECK(is_allowed_origin(Request{http::verb::get, "/v1/ws", 11}, narrow));  // no Origin
  }
}
