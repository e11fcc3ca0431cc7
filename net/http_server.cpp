// Beast sessions as coroutines. Kept to this one file: Beast is slow to compile.
#include "net/http_server.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "monitoring/metrics.hpp"
#include "net/openai_api.hpp"

namespace troupe::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Request = http::request<http::string_body>;
using EventChannel = asio::experimental::concurrent_channel<void(error_code, TokenEvent)>;
namespace websocket = beast::websocket;

// A frame for a WebSocket client, and whether it ends its request.
struct WsFrame {
  std::string id;
  std::string text;
  bool final = false;
};
using FrameChannel = asio::experimental::concurrent_channel<void(error_code, WsFrame)>;

// One WebSocket connection: the reader submits and cancels, the writer sends
// frames in order; both hold it.
struct WsConnection {
  explicit WsConnection(beast::tcp_stream stream) : ws(std::move(stream)) {}
  websocket::stream<beast::tcp_stream> ws;
  std::shared_ptr<FrameChannel> frames;
  std::unordered_map<std::string, RequestId> in_flight;  // the io thread's alone
};

constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

// Engine callbacks outlive nothing of the server: once the gate is shut (stop()),
// they drop their events instead of touching a channel whose io_context is gone.
struct CallbackGate {
  std::mutex mutex;
  bool open = true;
};

struct HttpServer::Impl {
  Engine& engine;
  std::shared_ptr<CallbackGate> gate = std::make_shared<CallbackGate>();
  ServerConfig config;
  ApiContext context;
  asio::io_context io;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<int> num_connections{0};
  std::atomic<int> num_requests{0};  // generation requests not yet answered in full
  std::atomic<std::uint64_t> next_completion{1};

  Impl(Engine& e, ServerConfig c) : engine(e), config(std::move(c)) {
    context.engine = &engine;
    context.served_model_name = config.served_model_name;
    context.chat_family = model::detect_chat_family(engine.chat_template());
  }

  asio::awaitable<void> listen();
  asio::awaitable<void> session(tcp::socket socket);
  asio::awaitable<bool> handle(beast::tcp_stream& stream, Request& request);
  asio::awaitable<void> websocket_session(beast::tcp_stream stream, Request request);
  asio::awaitable<void> websocket_writer(std::shared_ptr<WsConnection> connection);
  void websocket_command(WsConnection& connection, const std::string& text);
  http::response<http::string_body> route(const Request& request);
  // Counts a response in troupe_http_requests_total (known routes by name, others as "other").
  void count(const Request& request, int status) {
    if (!config.metrics) return;
    const auto path = std::string(request.target().substr(0, request.target().find('?')));
    static const char* const kRoutes[] = {
        "/health",   "/version",    "/metrics",        "/v1/models",
        "/tokenize", "/detokenize", "/v1/completions", "/v1/chat/completions",
        "/v1/ws"};
    std::string route = "other";
    for (const char* r : kRoutes) {
      if (path == r) route = r;
    }
    config.metrics->count_http(route, status);
  }
  asio::awaitable<bool> completions(beast::tcp_stream& stream, Request& request);
};

namespace {

std::int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

http::response<http::string_body> make_response(
    const Request& request, http::status status, std::string body,
    std::string_view content_type = "application/json") {
  http::response<http::string_body> res{status, request.version()};
  res.set(http::field::server, "troupe");
  res.set(http::field::content_type, content_type);
  res.keep_alive(request.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

http::response<http::string_body> error_response(const Request& request, const ApiError& error) {
  return make_response(request, static_cast<http::status>(error.status), error_json(error));
}

// Writes a response; false when the client is gone.
asio::awaitable<bool> send(beast::tcp_stream& stream, http::response<http::string_body> res,
                           std::chrono::seconds timeout) {
  stream.expires_after(timeout);
  auto [ec, n] = co_await http::async_write(stream, res, kUseTuple);
  co_return !ec && res.keep_alive();
}

}  // namespace

asio::awaitable<void> HttpServer::Impl::listen() {
  while (true) {
    auto [ec, socket] = co_await acceptor->async_accept(kUseTuple);
    if (ec) co_return;  // closed
    asio::co_spawn(io, session(std::move(socket)), asio::detached);
  }
}

asio::awaitable<void> HttpServer::Impl::session(tcp::socket socket) {
  struct Count {
    std::atomic<int>& n;
    explicit Count(std::atomic<int>& c) : n(c) { ++n; }
    ~Count() { --n; }
  } count(num_connections);
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  if (num_connections.load() > config.max_connections) {
    Request none;
    none.version(11);
    none.keep_alive(false);
    auto response =
        error_response(none, ApiError{503, "too many connections", "service_unavailable", ""});
    co_await send(stream, std::move(response), config.write_timeout);
    co_return;
  }
  while (true) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(config.max_body_bytes);
    stream.expires_after(config.read_timeout);
    auto [ec, n] = co_await http::async_read(stream, buffer, parser, kUseTuple);
    if (ec == http::error::body_limit) {
      Request req = parser.release();
      req.keep_alive(false);
      const ApiError error{
          413,
          "the request body is larger than " + std::to_string(config.max_body_bytes) + " bytes",
          "invalid_request_error", ""};
      auto response = error_response(req, error);
      co_await send(stream, std::move(response), config.write_timeout);
      break;
    }
    if (ec) break;  // closed, timed out or malformed HTTP
    Request request = parser.release();
    if (websocket::is_upgrade(request) &&
        request.target().substr(0, request.target().find('?')) == "/v1/ws") {
      if (!config.api_key.empty() &&
          request[http::field::authorization] != "Bearer " + config.api_key) {
        auto response = error_response(
            request, ApiError{401, "invalid or missing API key", "authentication_error", ""});
        co_await send(stream, std::move(response), config.write_timeout);
        break;
      }
      co_await websocket_session(std::move(stream), std::move(request));
      co_return;
    }
    if (!co_await handle(stream, request)) break;
  }
  error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

// Every response is built into a named local before the one co_await that sends
// it: GCC 12 destroys temporaries inside co_await expressions twice.
http::response<http::string_body> HttpServer::Impl::route(const Request& request) {
  const std::string target(request.target());
  const auto path = target.substr(0, target.find('?'));
  const bool get = request.method() == http::verb::get;
  const bool post = request.method() == http::verb::post;
  auto ok = [&](std::string body) {
    return make_response(request, http::status::ok, std::move(body));
  };
  auto fail = [&](const ApiError& error) { return error_response(request, error); };
  if (!config.api_key.empty() && path.rfind("/v1/", 0) == 0 &&
      request[http::field::authorization] != "Bearer " + config.api_key) {
    return fail(ApiError{401, "invalid or missing API key (Authorization: Bearer ...)",
                         "authentication_error", ""});
  }
  if (path == "/health" && get) return ok("");
  if (path == "/metrics" && get && config.metrics) {
    return make_response(request, http::status::ok, config.metrics->serialize(),
                         "text/plain; version=0.0.4");
  }
  if (path == "/version" && get) return ok(R"({"version":"0.1.0"})");
  if (path == "/v1/models" && get) return ok(models_response(context));
  if (path == "/tokenize" && post) {
    auto body = tokenize_response(request.body(), context);
    return body ? ok(std::move(*body)) : fail(body.error());
  }
  if (path == "/detokenize" && post) {
    auto body = detokenize_response(request.body(), context);
    return body ? ok(std::move(*body)) : fail(body.error());
  }
  const bool known = path == "/health" || path == "/version" || path == "/v1/models" ||
                     path == "/tokenize" || path == "/detokenize" || path == "/v1/completions" ||
                     path == "/v1/chat/completions";
  if (known) {
    return fail(ApiError{
        405, "method " + std::string(request.method_string()) + " is not allowed on " + path,
        "invalid_request_error", ""});
  }
  return fail(ApiError{404, "no route " + path, "NotFoundError", ""});
}

asio::awaitable<bool> HttpServer::Impl::handle(beast::tcp_stream& stream, Request& request) {
  const auto path = request.target().substr(0, request.target().find('?'));
  const bool completion = request.method() == http::verb::post &&
                          (path == "/v1/completions" || path == "/v1/chat/completions");
  const bool authorized =
      config.api_key.empty() || request[http::field::authorization] == "Bearer " + config.api_key;
  if (completion && authorized) {
    const bool alive = co_await completions(stream, request);
    co_return alive;
  }
  auto response = route(request);
  count(request, static_cast<int>(response.result_int()));
  const bool alive = co_await send(stream, std::move(response), config.write_timeout);
  co_return alive;
}

asio::awaitable<bool> HttpServer::Impl::completions(beast::tcp_stream& stream, Request& request) {
  const bool chat = request.target().starts_with("/v1/chat/completions");
  auto parsed = chat ? parse_chat_request(request.body(), context)
                     : parse_completion_request(request.body(), context);
  if (!parsed) {
    count(request, parsed.error().status);
    auto response = error_response(request, parsed.error());
    const bool alive = co_await send(stream, std::move(response), config.write_timeout);
    co_return alive;
  }
  const CompletionRequest& completion = *parsed;
  const std::string id =
      (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_completion.fetch_add(1));
  const std::int64_t created = unix_time();

  // Admission: past the limit, the client should come back later.
  if (num_requests.fetch_add(1) >= config.max_concurrent_requests) {
    --num_requests;
    const ApiError busy{429,
                        "the server has " + std::to_string(config.max_concurrent_requests) +
                            " requests in flight: try again later",
                        "rate_limit_error", ""};
    count(request, 429);
    auto response = error_response(request, busy);
    const bool alive = co_await send(stream, std::move(response), config.write_timeout);
    co_return alive;
  }
  struct Release {
    std::atomic<int>& n;
    ~Release() { --n; }
  } release{num_requests};

  // Engine events cross into this coroutine through a channel; it never blocks the engine.
  auto channel = std::make_shared<EventChannel>(co_await asio::this_coro::executor, 1024);
  TokenCallback on_event = [channel, gate = gate](const TokenEvent& e) {
    std::lock_guard lock(gate->mutex);
    if (!gate->open) return;
    if (!channel->try_send(error_code{}, e))
      channel->async_send(error_code{}, e, [](error_code) {});
  };
  // n choices are n engine requests of one prompt; their events share the channel.
  std::vector<RequestId> ids;
  for (std::int32_t i = 0; i < completion.n; ++i) {
    GenerateRequest generate = completion.generate;
    if (generate.params.seed && i > 0) *generate.params.seed += static_cast<std::uint64_t>(i);
    auto submitted = engine.submit(std::move(generate), on_event);
    if (!submitted) {
      for (RequestId started : ids) engine.cancel(started);
      const Error& e = submitted.error();
      const int status = e.code == ErrorCode::internal ? 500 : 400;
      const ApiError error{status, e.message,
                           status == 500 ? "internal_error" : "invalid_request_error", ""};
      count(request, status);
      auto response = error_response(request, error);
      const bool alive = co_await send(stream, std::move(response), config.write_timeout);
      co_return alive;
    }
    ids.push_back(*submitted);
  }
  auto index_of = [&ids](RequestId id) {
    return static_cast<int>(std::find(ids.begin(), ids.end(), id) - ids.begin());
  };
  int num_open = completion.n;

  if (!completion.stream) {
    std::vector<CompletionOutput> outputs(static_cast<std::size_t>(completion.n));
    std::string failure;
    while (num_open > 0) {
      auto [ec, event] = co_await channel->async_receive(kUseTuple);
      if (ec) break;
      CompletionOutput& output = outputs[index_of(event.request_id)];
      output.text += event.text;
      if (event.token != kNoToken && completion.want_logprobs) output.tokens.push_back(event);
      if (event.finished) {
        if (event.finish_reason == FinishReason::error) failure = event.error;
        output.end = std::move(event);
        --num_open;
      }
    }
    auto response =
        !failure.empty()
            ? error_response(request, ApiError{500, failure, "internal_error", ""})
            : make_response(request, http::status::ok,
                            completion_response(context, id, created, completion, outputs));
    count(request, static_cast<int>(response.result_int()));
    const bool alive = co_await send(stream, std::move(response), config.write_timeout);
    co_return alive;
  }

  // Server-sent events: one chunk per event, then usage and [DONE] after the last choice.
  http::response<http::empty_body> head{http::status::ok, request.version()};
  head.set(http::field::server, "troupe");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.chunked(true);
  head.keep_alive(request.keep_alive());
  http::response_serializer<http::empty_body> serializer{head};
  count(request, 200);
  stream.expires_after(config.write_timeout);
  auto [head_ec, head_n] = co_await http::async_write_header(stream, serializer, kUseTuple);
  bool alive = !head_ec;
  std::string data;
  if (alive && completion.chat) {  // a chat stream opens each choice with the assistant's role
    data.clear();
    for (int i = 0; i < completion.n; ++i) {
      data += "data: " + chat_role_chunk(context, id, created, i) + "\n\n";
    }
    const auto chunk = http::make_chunk(asio::buffer(data));
    auto [rec, rn] = co_await asio::async_write(stream, chunk, kUseTuple);
    alive = !rec;
  }
  std::int32_t completion_tokens = 0;
  while (alive && num_open > 0) {
    auto [ec, event] = co_await channel->async_receive(kUseTuple);
    if (ec) break;
    data = "data: " +
           completion_chunk(context, id, created, completion, event, index_of(event.request_id)) +
           "\n\n";
    if (event.finished) {
      --num_open;
      completion_tokens += event.num_generated_tokens;
      if (num_open == 0 && completion.include_usage) {
        data += "data: " + usage_chunk(context, id, created, completion, event, completion_tokens) +
                "\n\n";
      }
      if (num_open == 0) data += "data: [DONE]\n\n";
    }
    stream.expires_after(config.write_timeout);
    const auto chunk = http::make_chunk(asio::buffer(data));
    auto [wec, wn] = co_await asio::async_write(stream, chunk, kUseTuple);
    // A client that went away is only seen when a write fails: cancel its requests then.
    if (wec) alive = false;
  }
  if (!alive) {
    for (RequestId started : ids) engine.cancel(started);
    channel->close();
    co_return false;
  }
  stream.expires_after(config.write_timeout);
  const auto last = http::make_chunk_last();
  auto [lec, ln] = co_await asio::async_write(stream, last, kUseTuple);
  co_return !lec && request.keep_alive();
}

asio::awaitable<void> HttpServer::Impl::websocket_session(beast::tcp_stream stream,
                                                          Request request) {
  stream.expires_never();  // the websocket's own timeouts take over
  auto connection = std::make_shared<WsConnection>(std::move(stream));
  auto& ws = connection->ws;
  ws.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
  ws.read_message_max(config.max_body_bytes);
  auto [accept_ec] = co_await ws.async_accept(request, kUseTuple);
  if (accept_ec) co_return;
  connection->frames = std::make_shared<FrameChannel>(co_await asio::this_coro::executor, 4096);
  asio::co_spawn(io, websocket_writer(connection), asio::detached);
  beast::flat_buffer buffer;
  while (true) {
    auto [ec, n] = co_await ws.async_read(buffer, kUseTuple);
    if (ec) break;  // closed by the client, or broken
    const std::string text = beast::buffers_to_string(buffer.data());
    buffer.consume(buffer.size());
    websocket_command(*connection, text);
  }
  // Closing the socket cancels every request still running on it.
  for (const auto& [id, request_id] : connection->in_flight) {
    engine.cancel(request_id);
    --num_requests;
  }
  connection->in_flight.clear();
  connection->frames->close();
}

asio::awaitable<void> HttpServer::Impl::websocket_writer(std::shared_ptr<WsConnection> connection) {
  auto& ws = connection->ws;
  ws.text(true);
  while (true) {
    auto [ec, frame] = co_await connection->frames->async_receive(kUseTuple);
    if (ec) co_return;  // closed: the reader has finished
    if (frame.final && connection->in_flight.erase(frame.id) == 1) --num_requests;
    auto [wec, wn] = co_await ws.async_write(asio::buffer(frame.text), kUseTuple);
    if (wec) {
      // The client is gone: cancel what it had asked for.
      for (const auto& [id, request_id] : connection->in_flight) {
        engine.cancel(request_id);
        --num_requests;
      }
      connection->in_flight.clear();
      co_return;
    }
  }
}

void HttpServer::Impl::websocket_command(WsConnection& connection, const std::string& text) {
  auto push = [&](WsFrame frame) {
    if (!connection.frames->try_send(error_code{}, frame)) {
      connection.frames->async_send(error_code{}, std::move(frame), [](error_code) {});
    }
  };
  auto command = parse_websocket_command(text);
  if (!command) {
    push({"", websocket_error("", command.error()), false});
    return;
  }
  const std::string& id = command->id;
  if (command->type == "cancel") {
    if (const auto it = connection.in_flight.find(id); it != connection.in_flight.end()) {
      engine.cancel(it->second);  // its "done" frame, finish_reason "abort", follows
    }
    return;
  }
  if (connection.in_flight.contains(id)) {
    push({id,
          websocket_error(id, ApiError{400, "a request with this id is already running",
                                       "invalid_request_error", "id"}),
          false});
    return;
  }
  const bool chat = text.find("\"messages\"") != std::string::npos;
  auto parsed = chat ? parse_chat_request(text, context) : parse_completion_request(text, context);
  if (!parsed) {
    push({id, websocket_error(id, parsed.error()), false});
    return;
  }
  if (parsed->n != 1) {
    push({id,
          websocket_error(id,
                          ApiError{400, "n must be 1 on the socket: send one generate per choice",
                                   "invalid_request_error", "n"}),
          false});
    return;
  }
  const bool want_logprobs = parsed->want_logprobs;
  TokenCallback on_event = [frames = connection.frames, gate = gate, ctx = &context, id,
                            want_logprobs](const TokenEvent& e) {
    std::lock_guard lock(gate->mutex);
    if (!gate->open) return;
    WsFrame frame{id, websocket_event(*ctx, id, e, want_logprobs), e.finished};
    if (!frames->try_send(error_code{}, frame)) {
      frames->async_send(error_code{}, std::move(frame), [](error_code) {});
    }
  };
  // The same admission limit as HTTP requests.
  if (num_requests.fetch_add(1) >= config.max_concurrent_requests) {
    --num_requests;
    push({id,
          websocket_error(id, ApiError{429, "too many requests in flight: try again later",
                                       "rate_limit_error", ""}),
          false});
    return;
  }
  auto submitted = engine.submit(parsed->generate, std::move(on_event));
  if (!submitted) {
    --num_requests;
    push(
        {id,
         websocket_error(id, ApiError{400, submitted.error().message, "invalid_request_error", ""}),
         false});
    return;
  }
  connection.in_flight.emplace(id, *submitted);
}

HttpServer::HttpServer(Engine& engine, ServerConfig config)
    : impl_(std::make_unique<Impl>(engine, std::move(config))) {}

HttpServer::~HttpServer() {
  stop();
}

Result<void> HttpServer::start() {
  auto& impl = *impl_;
  error_code ec;
  const auto address = asio::ip::make_address(impl.config.host, ec);
  if (ec)
    return make_error(ErrorCode::invalid_argument,
                      "bad host '" + impl.config.host + "': " + ec.message());
  impl.acceptor = std::make_unique<tcp::acceptor>(impl.io);
  const tcp::endpoint endpoint(address, impl.config.port);
  impl.acceptor->open(endpoint.protocol(), ec);
  if (!ec) impl.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl.acceptor->bind(endpoint, ec);
  if (!ec) impl.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error(ErrorCode::io, "cannot listen on " + impl.config.host + ":" +
                                         std::to_string(impl.config.port) + ": " + ec.message());
  }
  asio::co_spawn(impl.io, impl.listen(), asio::detached);
  for (int i = 0; i < std::max(1, impl.config.num_threads); ++i) {
    impl.threads.emplace_back([&impl] { impl.io.run(); });
  }
  return {};
}

void HttpServer::stop() {
  auto& impl = *impl_;
  {
    std::lock_guard lock(impl.gate->mutex);
    impl.gate->open = false;
  }
  if (impl.threads.empty()) return;
  impl.io.stop();
  for (auto& t : impl.threads) t.join();
  impl.threads.clear();
}

std::uint16_t HttpServer::port() const {
  return impl_->acceptor ? impl_->acceptor->local_endpoint().port() : impl_->config.port;
}

int HttpServer::num_connections() const {
  return impl_->num_connections.load();
}

}  // namespace troupe::net
