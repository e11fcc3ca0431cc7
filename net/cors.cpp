#include "net/cors.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

namespace troupe::net {

namespace {

// What "*" in --allowed-methods stands for in a preflight's answer (as Starlette, vLLM's).
constexpr std::string_view kAllMethods = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";
// Headers a browser may always send (CORS-safelisted).
constexpr std::array<std::string_view, 4> kSafelisted = {"accept", "accept-language",
                                                         "content-language", "content-type"};

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

bool has(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

bool all_origins(const CorsConfig& cors) {
  return has(cors.allowed_origins, "*");
}

bool origin_allowed(std::string_view origin, const CorsConfig& cors) {
  return all_origins(cors) || has(cors.allowed_origins, origin);
}

bool method_allowed(std::string_view method, const CorsConfig& cors) {
  return has(cors.allowed_methods, "*") ||
         std::any_of(cors.allowed_methods.begin(), cors.allowed_methods.end(),
                     [method](const std::string& m) { return lower(m) == lower(method); });
}

bool header_allowed(std::string_view header, const CorsConfig& cors) {
  const std::string name = lower(header);
  return has(cors.allowed_headers, "*") ||
         std::find(kSafelisted.begin(), kSafelisted.end(), name) != kSafelisted.end() ||
         std::any_of(cors.allowed_headers.begin(), cors.allowed_headers.end(),
                     [&name](const std::string& h) { return lower(h) == name; });
}

std::string joined(const std::vector<std::string>& list) {
  std::string out;
  for (const auto& item : list) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

// The origin the answer names: "*" when any origin may read it and no credentials are
// involved (a browser refuses "*" with credentials), else the request's own.
void allow_origin(std::string_view origin, http::fields& response, const CorsConfig& cors) {
  if (all_origins(cors) && !cors.allow_credentials) {
    response.set(http::field::access_control_allow_origin, "*");
    return;
  }
  response.set(http::field::access_control_allow_origin, origin);
  response.set(http::field::vary, "Origin");
  if (cors.allow_credentials) response.set(http::field::access_control_allow_credentials, "true");
}

}  // namespace

bool is_cors_preflight(const Request& request) {
  return request.method() == http::verb::options &&
         request.find(http::field::origin) != request.end() &&
         request.find(http::field::access_control_request_method) != request.end();
}

Response cors_preflight_response(const Request& request, const CorsConfig& cors) {
  const std::string_view origin = request[http::field::origin];
  const std::string_view method = request[http::field::access_control_request_method];
  const std::string_view headers = request[http::field::access_control_request_headers];
  std::vector<std::string> refused;
  if (!origin_allowed(origin, cors)) refused.emplace_back("origin");
  if (!method_allowed(method, cors)) refused.emplace_back("method");
  bool headers_ok = true;
  for (std::size_t start = 0; start <= headers.size();) {
    const std::size_t end = std::min(headers.find(',', start), headers.size());
    const auto name = trim(headers.substr(start, end - start));
    if (!name.empty() && !header_allowed(name, cors)) headers_ok = false;
    start = end + 1;
  }
  if (!headers_ok) refused.emplace_back("headers");
  if (!refused.empty()) {
    auto response = make_response(request, http::status::bad_request,
                                  "Disallowed CORS " + joined(refused), "text/plain");
    return response;
  }
  auto response = make_response(request, http::status::ok, "OK", "text/plain");
  allow_origin(origin, response, cors);
  if (!all_origins(cors) || cors.allow_credentials) response.set(http::field::vary, "Origin");
  response.set(http::field::access_control_allow_methods, has(cors.allowed_methods, "*")
                                                              ? std::string(kAllMethods)
                                                              : joined(cors.allowed_methods));
  // "*" allows whatever the browser asked for: say those back (a literal "*" is not
  // honoured with credentials).
  if (has(cors.allowed_headers, "*")) {
    if (!headers.empty()) response.set(http::field::access_control_allow_headers, headers);
  } else {
    std::vector<std::string> names(kSafelisted.begin(), kSafelisted.end());
    names.insert(names.end(), cors.allowed_headers.begin(), cors.allowed_headers.end());
    response.set(http::field::access_control_allow_headers, joined(names));
  }
  response.set(http::field::access_control_max_age, "600");
  return response;
}

void add_cors_headers(const Request& request, http::fields& response, const CorsConfig& cors) {
  const auto found = request.find(http::field::origin);
  if (found == request.end()) return;
  // A narrowed list makes the answer depend on the origin: caches must keep them apart.
  if (!all_origins(cors) || cors.allow_credentials) response.set(http::field::vary, "Origin");
  if (!origin_allowed(found->value(), cors)) return;
  allow_origin(found->value(), response, cors);
  // A page reads no response header but the CORS-safelisted ones unless they are exposed:
  // the request's id (the client's X-Request-Id echoed, or the server's) is for it too.
  response.set(http::field::access_control_expose_headers, "X-Request-Id");
}

bool is_allowed_origin(const Request& request, const CorsConfig& cors) {
  const auto found = request.find(http::field::origin);
  return found == request.end() || origin_allowed(found->value(), cors);
}

}  // namespace troupe::net
