// A server-sent event stream's response, for every route that streams (a completion's
// SSE in completion_session.cpp, the engine's steps in engine_events.cpp): its head
// (text/event-stream, no-cache; chunked, or on HTTP/1.0 the body up to the close), its
// data, and its last chunk.
#pragma once

#include <string_view>

#include "net/server_impl.hpp"

namespace troupe::net {

class EventStreamWriter {
 public:
  EventStreamWriter(ServerStream& stream, const Request& request, std::chrono::seconds timeout)
      : stream_(stream), chunked_(request.version() >= 11), timeout_(timeout) {}
  // HTTP/1.0 has no chunked encoding: its stream is the body up to the connection's close.
  bool chunked() const { return chunked_; }
  // Writes the head: 200, CORS and X-Request-Id as the request asks. `keep_alive`: the
  // connection may serve another request after the stream (chunked only). False when the
  // client is gone.
  asio::awaitable<bool> head(const Request& request, const CorsConfig& cors,
                             const AccessEntry& entry, bool keep_alive);
  // Writes `data` (one or more whole events): a chunk, or bytes of the body.
  asio::awaitable<bool> write(std::string_view data);
  // Ends a chunked stream with its last chunk; false when the connection must close (an
  // HTTP/1.0 stream's end is the close).
  asio::awaitable<bool> finish();

 private:
  ServerStream& stream_;
  const bool chunked_;
  const std::chrono::seconds timeout_;
};

}  // namespace troupe::net
