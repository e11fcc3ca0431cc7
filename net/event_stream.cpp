#include "net/event_stream.hpp"

#include "net/cors.hpp"

namespace troupe::net {

namespace http = beast::http;

asio::awaitable<bool> EventStreamWriter::head(const Request& request, const CorsConfig& cors,
                                              const AccessEntry& entry, bool keep_alive) {
  http::response<http::empty_body> head{http::status::ok, request.version()};
  head.set(http::field::server, "troupe");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.chunked(chunked_);
  head.keep_alive(chunked_ && keep_alive);
  add_cors_headers(request, head, cors);
  add_request_id_header(head, entry);
  http::response_serializer<http::empty_body> serializer{head};
  stream_.expires_after(timeout_);
  auto [ec, n] = co_await http::async_write_header(stream_, serializer, kUseTuple);
  co_return !ec;
}

asio::awaitable<bool> EventStreamWriter::write(std::string_view data) {
  stream_.expires_after(timeout_);
  if (chunked_) {
    const auto chunk = http::make_chunk(asio::buffer(data));
    auto [ec, n] = co_await asio::async_write(stream_, chunk, kUseTuple);
    co_return !ec;
  }
  auto [ec, n] = co_await asio::async_write(stream_, asio::buffer(data), kUseTuple);
  co_return !ec;
}

asio::awaitable<bool> EventStreamWriter::finish() {
  if (!chunked_) co_return false;  // the close ends the body
  stream_.expires_after(timeout_);
  const auto last = http::make_chunk_last();
  auto [ec, n] = co_await asio::async_write(stream_, last, kUseTuple);
  co_return !ec;
}

}  // namespace troupe::net
