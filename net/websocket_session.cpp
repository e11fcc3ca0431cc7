// WebSocket streaming at /v1/ws (protocol: docs/websocket.md): a reader coroutine that
// parses and submits, a writer coroutine that sends frames in order, and the bound on
// what a client may leave unread.
#include <unordered_map>

#include "net/choice_text.hpp"
#include "net/server_impl.hpp"

namespace troupe::net {

// A frame for a WebSocket client, and whether it ends its request.
struct WsFrame {
  std::string id;
  std::string text;
  bool final = false;
};
using FrameChannel = asio::experimental::concurrent_channel<void(error_code, WsFrame)>;

// What a connection's engine callbacks hold: its frames and their bound. Not the
// connection itself, which must not outlive the server.
struct WsOutput {
  WsOutput(std::shared_ptr<FrameChannel> f, std::size_t most)
      : frames(std::move(f)), output(most) {}
  std::shared_ptr<FrameChannel> frames;
  OutputBound output;
  // The client closed the socket, broke it, or fell too far behind: what ends now was
  // not taken (the access log's client_gone).
  std::atomic<bool> client_gone{false};

  // Queues a frame (never blocks); false when it crossed the bound: the caller closes.
  bool push(WsFrame frame) {
    if (output.over()) return true;
    if (output.add(static_cast<std::int64_t>(frame.text.size()))) return false;
    if (!frames->try_send(error_code{}, frame)) {
      frames->async_send(error_code{}, std::move(frame), [](error_code) {});
    }
    return true;
  }
};

// One WebSocket connection: the reader submits and cancels, the writer sends frames in
// order; both hold it.
struct WsConnection {
  WsConnection(ServerStream stream, std::string peer)
      : ws(std::move(stream)), client(std::move(peer)) {}
  websocket::stream<ServerStream> ws;
  const std::string client;  // the peer's address, for the access log
  std::shared_ptr<WsOutput> out;
  // The connection's strand alone touches these.
  std::unordered_map<std::string, RequestId> in_flight;
  bool closing = false;
};

namespace {

// Cancels every request still running on the connection (on its strand): the client
// closed it, is gone, or fell too far behind (what ends now is logged client_gone).
void cancel_in_flight(Engine& engine, WsConnection& connection) {
  connection.out->client_gone = true;
  for (const auto& [id, request_id] : connection.in_flight) engine.cancel(request_id);
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
  beast::flat_buffer buffer;
  while (!connection->closing) {
    auto [ec, n] = co_await ws.async_read(buffer, kUseTuple);
    if (ec) break;  // closed by the client, or broken
    std::string text = beast::buffers_to_string(buffer.data());
    buffer.consume(buffer.size());
    co_await websocket_command(connection, std::move(text));
  }
  // Closing the socket cancels every request still running on it.
  cancel_in_flight(engine, *connection);
  connection->out->frames->close();
}

asio::awaitable<void> HttpServer::Impl::websocket_writer(std::shared_ptr<WsConnection> connection) {
  auto& ws = connection->ws;
  ws.text(true);
  const auto out = connection->out;
  while (true) {
    auto [ec, frame] = co_await out->frames->async_receive(kUseTuple);
    if (ec) co_return;  // closed: the reader has finished, or the client fell behind
    if (frame.final) connection->in_flight.erase(frame.id);
    auto [wec, wn] = co_await ws.async_write(asio::buffer(frame.text), kUseTuple);
    out->output.remove(static_cast<std::int64_t>(frame.text.size()));
    if (wec) {
      // The client is gone: cancel what it had asked for.
      cancel_in_flight(engine, *connection);
      co_return;
    }
  }
}

void HttpServer::Impl::websocket_overflow(const std::shared_ptr<WsConnection>& connection) {
  using namespace std::chrono_literals;
  if (connection->closing) return;
  connection->closing = true;
  if (config.metrics) config.metrics->count_connection_error("slow_reader");
  cancel_in_flight(engine, *connection);
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
    push({id, websocket_error(id, error), false});
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
      engine.cancel(it->second);  // its "done" frame, finish_reason "abort", follows
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
  // The same admission limit as HTTP requests.
  if (!admission->try_acquire()) {
    refuse(id,
           ApiError{429, "too many requests in flight: try again later", "rate_limit_error", ""});
    co_return;
  }
  auto strand = co_await asio::this_coro::executor;
  entry->request_id = id;
  // A chat whose text is read (thinking apart, tool calls) holds back what may be a marker
  // or a call, as over HTTP; the engine's thread alone feeds it.
  std::shared_ptr<ChoiceTextStream> reads;
  if (request.chat && ChoiceTextStream(request).reads()) {
    reads = std::make_shared<ChoiceTextStream>(request);
  }
  TokenCallback on_event = [out, gate = gate, admission = admission, ctx = &context, id,
                            want_logprobs = request.want_logprobs, strand,
                            weak = std::weak_ptr<WsConnection>(connection), entry,
                            logged = access_logged(), client = connection->client, reads,
                            this](const TokenEvent& e) {
    std::optional<ChoiceText> held;
    if (reads) held = reads->take(e.text, e.finished);
    if (logged) {
      if (e.token != kNoToken) entry->first_token();
      if (e.finished) {
        entry->status = e.finish_reason == FinishReason::error ? api_error(e).status : 200;
        entry->prompt_tokens = e.num_prompt_tokens;
        entry->ended(e, openai_finish_reason(e.finish_reason, held && !held->calls.empty()));
        entry->client_gone = out->client_gone.load();
      }
    }
    // The slot is freed when the request ends here, in the engine, not when written.
    if (e.finished) admission->release();
    std::lock_guard lock(gate->mutex);
    if (!gate->open) return;
    if (logged && e.finished) {
      // Written from the connection's strand: the engine's thread only hands it over.
      asio::post(strand, [this, entry, client] { log_access("WS", "/v1/ws", *entry, client); });
    }
    if (out->output.over()) return;
    const ChoiceText* shown = held ? &*held : nullptr;
    if (!out->push({id, websocket_event(*ctx, id, e, want_logprobs, shown), e.finished})) {
      asio::post(strand, [weak, this] {
        if (auto connection = weak.lock()) websocket_overflow(connection);
      });
    }
  };
  auto submitted = engine.submit(request.generate, std::move(on_event));
  if (!submitted) {
    admission->release();
    refuse(id, api_error(submitted.error()));  // the status HTTP gives the same error
    co_return;
  }
  connection->in_flight.emplace(id, *submitted);
}

}  // namespace troupe::net
