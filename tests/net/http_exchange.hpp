// One HTTP POST of a JSON body to a server on loopback, read to the end of its answer (a
// whole SSE stream too), for the tests of the server over real sockets.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <string>
#include <vector>

namespace troupe::test {

struct HttpReply {
  int status = 0;  // 0: no answer within the deadline
  std::string body;
};

namespace detail {

inline boost::asio::awaitable<void> exchange(std::uint16_t port, std::string target,
                                             std::string body, HttpReply& reply) {
  namespace asio = boost::asio;
  namespace beast = boost::beast;
  namespace http = beast::http;
  beast::tcp_stream stream(co_await asio::this_coro::executor);
  co_await stream.async_connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port),
                                asio::use_awaitable);
  http::request<http::string_body> request{http::verb::post, target, 11};
  request.set(http::field::host, "127.0.0.1");
  request.set(http::field::content_type, "application/json");
  request.body() = std::move(body);
  request.prepare_payload();
  co_await http::async_write(stream, request, asio::use_awaitable);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(boost::none);
  co_await http::async_read(stream, buffer, parser, asio::use_awaitable);
  reply.status = static_cast<int>(parser.get().result_int());
  reply.body = parser.get().body();
}

}  // namespace detail

// A server that hangs fails the caller's checks at the deadline instead of holding the test.
// Asserts nothing: it may run on a test's own threads, and Catch2's assertions are not
// thread-safe.
inline HttpReply post_json(std::uint16_t port, const std::string& target, std::string body,
                           std::chrono::seconds deadline = std::chrono::seconds(120)) {
  boost::asio::io_context io;
  HttpReply reply;
  boost::asio::co_spawn(io, detail::exchange(port, target, std::move(body), reply),
                        [](const std::exception_ptr&) {});
  io.run_for(deadline);
  return reply;
}

// The data of each server-sent event of `body`, in order, and whether the stream ended
// with [DONE] (which is not among them).
struct SseEvents {
  std::vector<std::string> data;
  bool done = false;
};

inline SseEvents sse_events(const std::string& body) {
  SseEvents events;
  for (std::size_t pos = 0; (pos = body.find("data: ", pos)) != std::string::npos;) {
    const auto end = body.find("\n\n", pos);
    std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      events.done = true;
    } else {
      events.data.push_back(std::move(data));
    }
  }
  return events;
}

}  // namespace troupe::test
