// A connection's bytes through the server's HTTP reading and routing: the parser with
// the server's limits, fed the way a capped read buffer feeds it (pipelined requests
// included), each request routed as the server would.
//
// Input: byte 0 picks how the bytes arrive (in pieces of 1 to 256 bytes, or at once)
// and whether an API key is set; the rest is what the client sends.
// Invariants (abort when broken; an exception escaping is a crash too: the server's
// connections must never meet one):
//   - a request that cannot be read is answered 400, 413 or 431, or not at all
//     (the client went away mid-request);
//   - a routed answer has a status the routes give, and an error answer is an
//     OpenAI error object in JSON (the built-in page's files are routed too);
//   - a generation body parses into a request that holds what the engine is promised,
//     or into a 4xx.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "api_fixture.hpp"
#include "net/http_routes.hpp"

using namespace troupe;
namespace http = boost::beast::http;

namespace {

net::ServerConfig server_config(bool with_key) {
  net::ServerConfig config;
  config.max_body_bytes = 64 << 10;  // small enough to be reached
  if (with_key) config.api_key = "sekrit";
  return config;
}

void check_routed(const net::Request& request, const net::ServerConfig& config) {
  const auto& context = fuzz::api_context();
  if (net::is_generation(request) && net::is_authorized(request, config)) {
    const net::RouteKind kind = net::route_kind(request);
    auto parsed = kind == net::RouteKind::responses
                      ? net::parse_responses_request(request.body(), context)
                  : kind == net::RouteKind::chat_completion
                      ? net::parse_chat_request(request.body(), context)
                      : net::parse_completion_request(request.body(), context);
    if (parsed) {
      fuzz::check_request(*parsed, context);
    } else {
      fuzz::check_client_error(parsed.error());
    }
    return;
  }
  net::RouteContext route_context;
  route_context.config = &config;
  route_context.api = &context;
  route_context.metrics_text = [] { return std::string("troupe_up 1\n"); };
  const net::Response response = net::route(request, route_context);
  const unsigned status = response.result_int();
  TROUPE_FUZZ_CHECK(status == 200 || status == 304 || status == 400 || status == 401 ||
                        status == 404 || status == 405,
                    "routes answer 200, 304 (the page unchanged), 400, 401, 404 or 405");
  if (status >= 400) fuzz::check_json(response.body(), "error answers are JSON");
  if (status == 304) TROUPE_FUZZ_CHECK(response.body().empty(), "a 304 has no body");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t piece = data[0] & 0x80 ? size : 1 + (data[0] & 0x7f) * 2;
  const auto config = server_config(data[0] & 0x40);
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::size_t cap = net::max_unparsed_bytes(config);

  std::string unparsed;  // what the capped read buffer holds
  std::size_t offset = 0;
  auto parser = std::make_unique<net::RequestParser>();
  net::configure_parser(*parser, config);
  while (true) {
    boost::system::error_code ec;
    if (!unparsed.empty()) {
      const auto used = parser->put(boost::asio::buffer(unparsed), ec);
      unparsed.erase(0, used);
    } else {
      ec = http::error::need_more;
    }
    if (!ec && parser->is_done()) {
      const net::Request request = parser->release();
      check_routed(request, config);
      if (!request.keep_alive()) return 0;
      parser = std::make_unique<net::RequestParser>();
      net::configure_parser(*parser, config);
      continue;
    }
    if (ec && ec != http::error::need_more) {
      if (const auto error = net::read_error(ec, config)) {
        TROUPE_FUZZ_CHECK(error->status == 400 || error->status == 413 || error->status == 431,
                          "an unreadable request is a 400, 413 or 431");
        fuzz::check_json(net::error_json(*error), "error objects are JSON");
      }
      return 0;
    }
    // The parser wants more: read the next piece, as far as the buffer's cap allows.
    if (offset == input.size()) {
      parser->put_eof(ec);
      if (ec) {
        const auto error = net::read_error(ec, config);
        TROUPE_FUZZ_CHECK(!error || error->status == 400, "a cut-off request is a 400 or nothing");
      } else if (parser->is_done()) {
        check_routed(parser->release(), config);
      }
      return 0;
    }
    if (unparsed.size() >= cap) {
      const auto error = net::read_error(http::error::buffer_overflow, config);
      TROUPE_FUZZ_CHECK(error && error->status == 431, "a full buffer is a 431");
      return 0;
    }
    const std::size_t n = std::min({piece, input.size() - offset, cap - unparsed.size()});
    unparsed.append(input.substr(offset, n));
    offset += n;
  }
}
