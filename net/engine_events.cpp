// GET /v1/engine/events: the engine's steps as server-sent events, for the live page.
// The connection is one viewer of the StepEvents hub: the engine fills its bounded queue
// (dropping the oldest when this client reads too slowly), and this coroutine writes
// what is there whenever the queue's doorbell rings. Idle, it sends a comment every 15 s.
#include <sys/socket.h>

#include <cerrno>

#include "monitoring/step_events.hpp"
#include "net/event_stream.hpp"
#include "net/server_impl.hpp"
#include "text/unicode.hpp"

namespace troupe::net {

namespace {

using Doorbell = asio::experimental::concurrent_channel<void(error_code)>;

constexpr std::size_t kViewerCapacity = 512;  // events, about 10 s of steps at 50/s
constexpr auto kKeepalive = std::chrono::seconds(15);

// Stops watching when the coroutine ends, however it ends (a stopped server too).
struct WatchGuard {
  monitoring::StepEvents& events;
  std::shared_ptr<monitoring::StepEvents::Viewer> viewer;
  ~WatchGuard() { events.unwatch(viewer); }
};

struct StreamState {
  bool client_gone = false;
  bool ended = false;  // the coroutine is done: the socket may be gone
};

// The client closed its end: the doorbell rings so that the loop sees it now, not at
// its next write (while the engine is idle there is none).
void watch_for_close(tcp::socket& socket, std::shared_ptr<Doorbell> bell,
                     std::shared_ptr<StreamState> state) {
  socket.async_wait(tcp::socket::wait_read, [&socket, bell, state](error_code ec) {
    if (ec || state->ended) return;  // cancelled: the stream ended
    char byte = 0;
    const auto n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      return watch_for_close(socket, bell, state);
    }
    if (n > 0) return;  // it sent bytes (a pipelined request): still there
    state->client_gone = true;
    bell->try_send(error_code{});
  });
}

std::string hello_json(const ServerConfig& config, const Engine& engine) {
  std::string model;
  for (const char c : text::to_valid_utf8(config.served_model_name)) {
    if (c == '"' || c == '\\') model += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) model += c;
  }
  return R"({"type":"hello","model":")" + model + R"(","replicas":)" +
         std::to_string(engine.num_replicas()) + R"(,"cluster":)" +
         (engine.is_cluster_head() ? "true" : "false") + "}";
}

}  // namespace

asio::awaitable<bool> HttpServer::Impl::engine_events(ServerStream& stream, const Request& request,
                                                      AccessEntry& entry) {
  if (!config.step_events) {
    const ApiError error{404, "no route /v1/engine/events", "NotFoundError", ""};
    const bool alive = co_await refuse(stream, request, error, entry);
    co_return alive;
  }
  EventStreamWriter sse(stream, request, config.write_timeout);
  count(request, 200, entry);

  auto bell = std::make_shared<Doorbell>(stream.get_executor(), 1);
  auto state = std::make_shared<StreamState>();
  // The engine's thread rings; once the server stops (the gate shut) nothing is touched.
  auto viewer = config.step_events->watch(kViewerCapacity, [gate = gate, bell] {
    std::lock_guard lock(gate->mutex);
    if (gate->open) bell->try_send(error_code{});
  });
  const WatchGuard guard{*config.step_events, viewer};
  asio::steady_timer keepalive(stream.get_executor());

  // The stream ends with the connection.
  bool alive = co_await sse.head(request, config.cors, entry, /*keep_alive=*/false);
  std::string data = "data: " + hello_json(config, engine) + "\n\n";
  if (alive) alive = co_await sse.write(data);
  watch_for_close(stream.socket(), bell, state);
  while (alive) {
    keepalive.expires_after(kKeepalive);  // a pending wait is cancelled: it rings no more
    keepalive.async_wait([bell](error_code ec) {
      if (!ec) bell->try_send(error_code{});
    });
    auto [ec] = co_await bell->async_receive(kUseTuple);
    if (ec || state->client_gone) break;
    std::int64_t dropped = 0;
    const auto events = viewer->take(dropped);
    data.clear();
    for (const auto& event : events) {
      // The viewer's own count goes in before the object's closing brace.
      data += "data: ";
      data.append(*event, 0, event->size() - 1);
      data += ",\"dropped\":" + std::to_string(dropped) + "}\n\n";
      dropped = 0;
    }
    if (data.empty()) data = ": keepalive\n\n";
    alive = co_await sse.write(data);
  }
  keepalive.cancel();
  state->ended = true;
  error_code ignored;
  stream.socket().cancel(ignored);  // ends watch_for_close
  entry.client_gone = state->client_gone;
  co_return false;
}

}  // namespace troupe::net
