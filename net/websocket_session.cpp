// WebSocket streaming at /v1/ws (protocol: docs/websocket.md): a reader coroutine that
// parses and submits, a coroutine per request that frames its events (a GenerationStream's,
// on the connection's strand), a writer coroutine that sends the frames in order, and the
// bound on what a client may leave unread.
#include <unordered_map>

#include "net/generation_stream.hpp"
#include "net/server_impl.hpp"

namespace troupe::net {

// A frame for a WebSocket client, and whether it ends its request.
struct WsFrame {
  std::string id;
  std::string text;
  bool final = false;
  // A request's last frame: holds its stream in the drain's live set until written or
  // dropped (GenerationStream::finished_when_dropped).
  std::shared_ptr<void> last;
  // Not a frame: the writer closes the connection with 1001 (going away), the drain's end.
  bool close = false;
};
using FrameChannel = asio::experimental::concurrent_channel<void(error_code, WsFrame)>;

// A connection's frames and their bound, which its requests' events share (an event's
// memory until it is framed, then the frame's text until written).
struct WsOutput {
  WsOutput(std::shared_ptr<FrameChannel> f, std::size_t most)
      : frames(std::move(f)), output(std::make_shared<OutputBound>(most)) {}
  std::shared_ptr<FrameChannel> frames;
  std::shared_ptr<OutputBound> output;
  // The client closed the socket, broke it, or fell too far behind: what ends now was
  // not taken (the access log's client_gone).
  std::atomic<bool> client_gone{false};

  // Queues a frame (never blocks); false when it crossed the bound: the caller closes.
  bool push(WsFrame frame) {
    if (output->over()) return true;
    if (output->add(static_cast<std::int64_t>(frame.text.size()))) return false;
    if (!frames->try_send(error_code{}, frame)) {
      frames->async_send(error_code{}, std::move(frame), [](error_code) {});
    }
    return true;
  }
};

// One WebSocket connection: the reader submits and cancels, each request's coroutine
// frames its events, the writer sends frames in order; all hold it.
struct WsConnection {
  WsConnection(ServerStream stream, std::string peer)
      : ws(std::move(stream)), client(std::move(peer)) {}
  websocket::stream<ServerStream> ws;
  const std::string client;  // the peer's address, for the access log
  std::shared_ptr<WsOutput> out;
  // The connection's strand alone touches these.
  std::unordered_map<std::string, std::shared_ptr<GenerationStream>> in_flight;
  bool closing = false;
  // Set when the drain reached it: it goes away once its requests have ended, and counts in
  // the drain's closing sockets until it is gone.
  std::shared_ptr<Drain> leaving;

  WsConnection(const WsConnection&) = delete;
  WsConnection& operator=(const WsConnection&) = delete;
  ~WsConnection() {
    if (leaving) --leaving->closing_sockets;
  }
};

namespace {

// Cancels every request still running on the connection (on its strand): the client
// closed it, is gone, or fell too far behind (what ends now is logged client_gone).
void cancel_in_flight(WsConnection& connection) {
  connection.out->client_gone = true;
  for (const auto& [id, generation] : connection.in_flight) generation->cancel();
  connection.in_flight.clear();
}

}  // namespace

asio::awaitable<void> HttpServer::Impl::websocket_session(ServerStream stream, Request request,
                                                          std::string client) {
  stream.expires_never();  // the websocket's own timeouts take over
  auto executor = co_await asio::this_coro::executor;
  auto connection = std::make_shared<WsConnection>(std::move(stream), std::move(client));
  auto& ws = connection->ws;
  ws.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
  ws.read_message_max(config.max_body_bytes);
  // A browser fails a socket whose answer names none of the subprotocols it offered.
  if (std::string protocol = chosen_subprotocol(request); !protocol.empty()) {
    ws.set_option(websocket::stream_base::decorator(
        [protocol = std::move(protocol)](websocket::response_type& response) {
          response.set(beast::http::field::sec_websocket_protocol, protocol);
        }));
  }
  auto [accept_ec] = co_await ws.async_accept(request, kUseTuple);
  if (accept_ec) co_return;
  connection->out = std::make_shared<WsOutput>(std::make_shared<FrameChannel>(executor, 4096),
                                               config.max_buffered_output_bytes);
  asio::co_spawn(executor, websocket_writer(connection),
                 [this](std::exception_ptr e) { on_session_exception(e); });
  {
    std::lock_guard lock(sockets_mutex);
    sockets.emplace(connection.get(), connection);
  }
  if (draining()) {  // accepted as the drain began: it may have missed this one
    ++drain->closing_sockets;
    websocket_going_away(connection);
  }
  beast::flat_buffer buffer;
  while (!connection->closing) {
    auto [ec, n] = co_await ws.async_read(buffer, kUseTuple);
    if (ec) break;  // closed by the client, or broken
    std::string text = beast::buffers_to_string(buffer.data());
    buffer.consume(buffer.size());
    co_await websocket_command(connection, std::move(text));
  }
  // Closing the socket cancels every request still running on it.
  cancel_in_flight(*connection);
  connection->out->frames->close();
  std::lock_guard lock(sockets_mutex);
  sockets.erase(connection.get());
}

void HttpServer::Impl::sockets_go_away() {
  std::vector<std::shared_ptr<WsConnection>> open;
  {
    std::lock_guard lock(sockets_mutex);
    for (const auto& [key, weak] : sockets) {
      if (auto connection = weak.lock()) open.push_back(std::move(connection));
    }
  }
  // Counted now, before the drain can look: each is uncounted once gone.
  drain->closing_sockets += static_cast<int>(open.size());
  for (auto& connection : open) {
    auto strand = connection->ws.get_executor();
    asio::post(strand,
               [this, connection = std::move(connection)] { websocket_going_away(connection); });
  }
}

void HttpServer::Impl::websocket_going_away(const std::shared_ptr<WsConnection>& connection) {
  if (connection->leaving) {  // reached twice: counted once
    --drain->closing_sockets;
    return;
  }
  connection->leaving = drain;
  // With requests running, the writer closes after the last one's final frame.
  if (!connection->closing && connection->in_flight.empty()) {
    connection->out->push({"", "", false, nullptr, /*close=*/true});
  }
}

asio::awaitable<void> HttpServer::Impl::websocket_writer(std::shared_ptr<WsConnection> connection) {
  auto& ws = connection->ws;
  ws.text(true);
  const auto out = connection->out;
  while (true) {
    auto [ec, frame] = co_await out->frames->async_receive(kUseTuple);
    if (ec) co_return;  // closed: the reader has finished, or the client fell behind
    if (!frame.close) {
      if (frame.final) connection->in_flight.erase(frame.id);
      auto [wec, wn] = co_await ws.async_write(asio::buffer(frame.text), kUseTuple);
      out->output->remove(static_cast<std::int64_t>(frame.text.size()));
      if (wec) {
        // The client is gone: cancel what it had asked for.
        cancel_in_flight(*connection);
        co_return;
      }
      frame.last.reset();  // written: the drain no longer waits for it
      if (!frame.final || !connection->leaving || !connection->in_flight.empty()) continue;
    }
    // The drain's end for this socket: 1001 (going away), as a server shutting down says.
    // A client that does not answer the close within 2 s is cut.
    if (connection->closing) co_return;
    connection->closing = true;
    out->frames->close();
    asio::steady_timer timer(ws.get_executor(), std::chrono::seconds(2));
    timer.async_wait([connection](error_code timer_ec) {
      if (!timer_ec) beast::get_lowest_layer(connection->ws).close();
    });
    const websocket::close_reason reason(websocket::close_code::going_away,
                                         "the server is shutting down");
    co_await ws.async_close(reason, kUseTuple);
    timer.cancel();
    co_return;
  }
}

void HttpServer::Impl::websocket_overflow(const std::shared_ptr<WsConnection>& connection) {
  using namespace std::chrono_literals;
  if (connection->closing) return;
  connection->closing = true;
  if (config.metrics) config.metrics->count_connection_error("slow_reader");
  cancel_in_flight(*connection);
  connection->out->frames->close();  // what is queued is dropped
  // Say why (1008), unless the client cannot even take that: then drop the connection.
  auto timer = std::make_shared<asio::steady_timer>(connection->ws.get_executor(), 2s);
  timer->async_wait([connection, timer](error_code ec) {
    if (!ec) beast::get_lowest_layer(connection->ws).close();
  });
  const websocket::close_reason reason(websocket::close_code::policy_error,
                                       "client too slow: more than " +
                                           std::to_string(config.max_buffered_output_bytes) +
                                           " bytes of output unread");
  connection->ws.async_close(reason, [connection, timer](error_code) { timer->cancel(); });
}

asio::awaitable<void> HttpServer::Impl::websocket_command(std::shared_ptr<WsConnection> connection,
                                                          std::string text) {
  const auto out = connection->out;
  // Its line in the access log, from the whole message read, as HTTP's from the request.
  auto entry = std::make_shared<AccessEntry>();
  auto push = [this, &connection](WsFrame frame) {
    if (!connection->out->push(std::move(frame))) websocket_overflow(connection);
  };
  // An error frame for the message with this id; it ends nothing that runs.
  auto refuse = [this, &push, &connection, &entry](const std::string& id, const ApiError& error) {
    push({id, websocket_error(id, error), false, nullptr});
    entry->status = error.status;
    entry->error = error.message;
    entry->request_id = id;
    log_access("WS", "/v1/ws", *entry, connection->client);
  };
  // Parsing tokenizes: off this thread.
  using Parsed = tl::expected<WebSocketMessage, WebSocketError>;
  std::function<Parsed()> parse = [this, text = std::move(text)]() -> Parsed {
    try {
      return parse_websocket_message(text, context);
    } catch (const std::exception& e) {
      return tl::unexpected(WebSocketError{"", ApiError{500, e.what(), "internal_error", ""}});
    }
  };
  Parsed parsed = co_await run_on(tokenizer_pool, std::move(parse));
  if (connection->closing) co_return;
  if (!parsed) {
    refuse(parsed.error().id, parsed.error().error);
    co_return;
  }
  const std::string& id = parsed->id;
  if (parsed->type == "cancel") {
    if (const auto it = connection->in_flight.find(id); it != connection->in_flight.end()) {
      it->second->cancel();  // its "done" frame, finish_reason "abort", follows
    }
    co_return;
  }
  if (connection->in_flight.contains(id)) {
    refuse(id, ApiError{400, "a request with this id is already running", "invalid_request_error",
                        "id"});
    co_return;
  }
  if (std::ssize(connection->in_flight) >= config.max_requests_per_socket) {
    refuse(id,
           ApiError{429,
                    "this socket already runs " + std::to_string(config.max_requests_per_socket) +
                        " requests: wait for one to end, or open another socket",
                    "rate_limit_error", ""});
    co_return;
  }
  const CompletionRequest& request = parsed->request;
  if (request.n != 1) {
    refuse(id, ApiError{400, "n must be 1 on the socket: send one generate per choice",
                        "invalid_request_error", "n"});
    co_return;
  }
  const std::optional<ApiError> costly = co_await check_constraint(request);
  if (connection->closing) co_return;
  if (costly) {
    refuse(id, *costly);
    co_return;
  }
  // The same admission limit as HTTP requests; the events come back on this strand.
  GenerationStream::Options options;
  options.output = out->output;
  options.busy_message = "too many requests in flight: try again later";
  options.on_overflow = [this, weak = std::weak_ptr<WsConnection>(connection)] {
    if (auto connection = weak.lock()) websocket_overflow(connection);
  };
  auto strand = co_await asio::this_coro::executor;
  auto started = GenerationStream::start({engine, gate, admission, drain}, request,
                                         std::move(options), strand);
  if (!started) {
    refuse(id, started.error());  // the status HTTP gives the same error
    co_return;
  }
  entry->request_id = id;
  connection->in_flight.emplace(id, *started);
  asio::co_spawn(strand, websocket_stream(connection, *started, id, request.want_logprobs, entry),
                 [this](std::exception_ptr e) { on_session_exception(e); });
}

asio::awaitable<void> HttpServer::Impl::websocket_stream(
    std::shared_ptr<WsConnection> connection, std::shared_ptr<GenerationStream> generation,
    std::string id, bool want_logprobs, std::shared_ptr<AccessEntry> entry) {
  // Every request ends with an event (a cancelled one's finish_reason "abort"), even past
  // the bound, so that its line is written, once, after it.
  while (true) {
    std::optional<ChoiceEvent> next = co_await generation->next(*entry);
    if (!next) break;
    const TokenEvent& e = next->event;
    if (e.finished) {
      entry->status = e.finish_reason == FinishReason::error ? api_error(e).status : 200;
      entry->prompt_tokens = e.num_prompt_tokens;
      entry->client_gone = connection->out->client_gone.load();
    }
    const ChoiceText* shown = next->read ? &*next->read : nullptr;
    WsFrame frame{id, websocket_event(context, id, e, want_logprobs, shown), e.finished, nullptr};
    if (e.finished && generation->num_open() == 0) frame.last = generation->finished_when_dropped();
    generation->taken(*next);
    if (!connection->out->push(std::move(frame))) websocket_overflow(connection);
  }
  generation->detach();
  // Ended without a last frame (closed): the drain waits for nothing more of it. Else
  // this does nothing, and the frame's writing ends its wait.
  if (generation->num_open() > 0) generation->finished();
  log_access("WS", "/v1/ws", *entry, connection->client);
}

}  // namespace troupe::net
