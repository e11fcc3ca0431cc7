// The accept loop and HTTP sessions as coroutines: the TLS handshake of an HTTPS server,
// requests read within limits, the plain routes, and the hand-off of the rest (generation:
// completion_session.cpp; the WebSocket: websocket_session.cpp).
#include "net/http_server.hpp"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "monitoring/log.hpp"
#include "net/cors.hpp"
#include "net/generation_stream.hpp"
#include "net/lora_admin.hpp"
#include "net/server_impl.hpp"
#include "text/unicode.hpp"

namespace troupe::net {

namespace {

// Descriptors the process needs besides its connections: the listener, the engine's
// actor system, the model file, stdio, the tokenizer and I/O threads' wake-ups.
constexpr rlim_t kReservedDescriptors = 64;

// How long a TLS connection's end waits for the client's close_notify.
constexpr std::chrono::seconds kTlsCloseTimeout{2};

// An error answer to a request not read to its end (a body past the limit, say) leaves
// the client sending: closing with its bytes unread resets the connection, and a client
// that reads only once it has sent everything (Python's http.client, requests) never sees
// the answer. As nginx's lingering close: the sending side is shut, and what still comes
// is read and dropped, for at most kLingerTime (kLingerIdle without a byte) and
// kLingerBytes.
constexpr std::chrono::seconds kLingerTime{5};
constexpr std::chrono::seconds kLingerIdle{1};
constexpr std::size_t kLingerBytes = std::size_t{32} << 20;

asio::awaitable<void> linger(ServerStream& stream) {
  error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  const auto until = std::chrono::steady_clock::now() + kLingerTime;
  std::vector<char> sink(std::size_t{64} << 10);
  for (std::size_t dropped = 0; dropped < kLingerBytes;) {
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) break;
    stream.expires_after(std::min<std::chrono::steady_clock::duration>(kLingerIdle, left));
    auto [ec, n] = co_await stream.async_read_some(asio::buffer(sink), kUseTuple);
    if (ec) break;  // the client's end (EOF), a reset, or the time is up
    dropped += n;
  }
}

// The peer's address and port, for the log ("-" once it is gone).
std::string peer_name(const tcp::socket& socket) {
  error_code ec;
  const auto peer = socket.remote_endpoint(ec);
  if (ec) return "-";
  return peer.address().to_string() + ":" + std::to_string(peer.port());
}

}  // namespace

asio::awaitable<bool> write_response(ServerStream& stream, Response res,
                                     std::chrono::seconds timeout) {
  stream.expires_after(timeout);
  auto [ec, n] = co_await http::async_write(stream, res, kUseTuple);
  co_return !ec && res.keep_alive();
}

HttpServer::Impl::Impl(Engine& e, ServerConfig c)
    : engine(e),
      config(std::move(c)),
      admission(std::make_shared<Admission>(config.max_concurrent_requests)),
      tokenizer_pool(static_cast<std::size_t>(std::max(1, config.num_tokenizer_threads))) {
  const bool overridden = !config.chat_template.empty();
  std::string origin = "the model's own";
  if (overridden) {
    origin = config.chat_template_origin.empty() ? "--chat-template" : config.chat_template_origin;
  }
  context = make_api_context(engine.tokenizer(), engine.max_model_len(), config.served_model_name,
                             overridden ? config.chat_template : engine.chat_template(),
                             std::move(origin));
  if (const auto format = tool_call_format_named(config.tool_call_parser)) {
    context.tool_call_format = *format;
  }
  context.reasoning_format = text::reasoning_format_named(config.reasoning_parser);
  for (const auto& name : config.other_model_names) {
    context.other_model_names.push_back(text::to_valid_utf8(name));
  }
  for (std::size_t i = 0; i < config.lora_modules.size(); ++i) {
    const auto& lora = config.lora_modules[i];
    context.loras->add({text::to_valid_utf8(lora.name), text::to_valid_utf8(lora.path),
                        static_cast<std::int32_t>(i + 1)});
  }
  context.priority_scheduling = engine.scheduling_policy() == SchedulingPolicy::priority;
  context.max_logprobs = config.max_logprobs;
}

RouteContext HttpServer::Impl::route_context() {
  RouteContext r;
  r.config = &config;
  r.api = &context;
  if (config.metrics) {
    r.metrics_text = [this] {
      config.metrics->set_server_state(num_connections.load(), admission->in_flight.load(),
                                       engine.stats().num_live_actors);
      return config.metrics->serialize();
    };
  }
  if (engine.num_replicas() > 1 || engine.is_cluster_head()) {
    r.replicas_up = [this] { return engine.replica_count(); };
    r.cluster_json = [this] {
      return cluster_json(engine.nodes(), engine.replicas(), engine.replica_count());
    };
  }
  if (engine.is_cluster_head()) {
    r.drain_node = [this](const std::string& name) { return engine.drain_node(name); };
  }
  r.draining = [this] { return draining(); };
  r.lora_admin = [this](std::string_view path, std::string_view body) {
    const LoraAdmin admin{engine, config, context};
    return path == "/v1/load_lora_adapter" ? admin.load(body) : admin.unload(body);
  };
  r.start_drain = [this] {
    begin_drain("POST /v1/admin/drain");
    boost::json::object answer{
        {"status", "draining"},
        {"requests_in_flight", admission->in_flight.load()},
        {"shutdown_timeout_s", static_cast<std::int64_t>(config.shutdown_timeout.count())}};
    return boost::json::serialize(answer);
  };
  return r;
}

void HttpServer::Impl::begin_drain(const std::string& why) {
  {
    std::lock_guard lock(drain->mutex);
    if (drain->draining) return;
    drain->draining = true;
    drain->started = true;
  }
  if (config.metrics) config.metrics->set_draining(true);
  monitoring::log_info("draining (" + why + "): no new requests; " +
                           std::to_string(drain->num_live()) + " generation(s) running",
                       {{"generations", drain->num_live()}});
  sockets_go_away();
  // Connections waiting for a next request are closed now (on their strands), unless a
  // request has begun to arrive: that one is answered, and its connection closes after.
  std::lock_guard lock(idle_mutex);
  for (const auto& [key, waiting] : idle) {
    asio::post(waiting->strand, [waiting] {
      // Gone, answering, or a request has begun to arrive (a part of its head buffered, or
      // of its body parsed): not idle.
      if (waiting->stream == nullptr || waiting->parser == nullptr) return;
      if (waiting->buffer->size() > 0 || waiting->parser->got_some()) return;
      error_code ec;
      if (waiting->stream->socket().available(ec) > 0) return;
      waiting->stream->socket().cancel(ec);
    });
  }
}

void HttpServer::Impl::cut_generations() {
  std::vector<std::shared_ptr<GenerationStream>> running;
  {
    std::lock_guard lock(drain->mutex);
    for (const auto& [key, weak] : drain->live) {
      if (auto generation = weak.lock()) running.push_back(std::move(generation));
    }
  }
  for (auto& generation : running) generation->cut_on_strand();
}

namespace {

// An error response's reason, for the access log: its OpenAI error object's message.
std::string error_message(std::string_view body) {
  boost::system::error_code ec;
  const boost::json::value parsed = boost::json::parse(body, ec);
  if (ec || !parsed.is_object()) return {};
  const auto* error = parsed.as_object().if_contains("error");
  if (error == nullptr || !error->is_object()) return {};
  const auto* message = error->as_object().if_contains("message");
  return message != nullptr && message->is_string() ? std::string(message->get_string())
                                                    : std::string();
}

}  // namespace

asio::awaitable<void> HttpServer::Impl::listen() {
  using namespace std::chrono_literals;
  asio::steady_timer backoff_timer(io);
  auto backoff = 5ms;
  int num_failures = 0;
  while (acceptor->is_open()) {
    auto [ec, socket] = co_await acceptor->async_accept(asio::make_strand(io), kUseTuple);
    if (ec == asio::error::operation_aborted || !acceptor->is_open()) co_return;  // stopped
    if (ec) {
      // Out of descriptors (EMFILE, ENFILE), out of memory, or a peer that gave up
      // (ECONNABORTED): none of it ends the server. Wait a little and accept again.
      if (config.metrics) config.metrics->count_accept_error();
      if (num_failures++ == 0) warn("accept failed (" + ec.message() + "); retrying");
      backoff_timer.expires_after(backoff);
      co_await backoff_timer.async_wait(kUseTuple);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
      continue;
    }
    if (num_failures > 0) {
      warn("accepting again after " + std::to_string(num_failures) + " failed accepts");
      num_failures = 0;
    }
    backoff = 5ms;
    // Streamed tokens are small writes: without this, Nagle's algorithm holds a frame back
    // until the client's delayed ACK of the one before (~40 ms on Linux).
    error_code nodelay_ec;
    socket.set_option(tcp::no_delay(true), nodelay_ec);
    auto executor = socket.get_executor();
    asio::co_spawn(executor, session(std::move(socket)),
                   [this](std::exception_ptr e) { on_session_exception(e); });
  }
}

asio::awaitable<error_code> HttpServer::Impl::read_request(ServerStream& stream,
                                                           beast::flat_buffer& buffer,
                                                           RequestParser& parser) {
  stream.expires_after(config.read_timeout);
  auto [ec, n] = co_await http::async_read_header(stream, buffer, parser, kUseTuple);
  if (ec) co_return ec;
  if (parser.is_done()) co_return error_code{};
  // A client that sent Expect: 100-continue waits for a word before sending its body.
  if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
    const auto length = parser.content_length();
    if (length && *length > config.max_body_bytes) co_return http::error::body_limit;
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(kContinue), kUseTuple);
    if (wec) co_return wec;
  }
  stream.expires_after(config.read_timeout);
  auto [body_ec, body_n] = co_await http::async_read(stream, buffer, parser, kUseTuple);
  co_return body_ec;
}

asio::awaitable<void> HttpServer::Impl::session(tcp::socket socket) {
  struct Count {
    std::atomic<int>& n;
    explicit Count(std::atomic<int>& c) : n(c) { ++n; }
    ~Count() { --n; }
  } count_connection(num_connections);
  const std::string client = peer_name(socket);
  ServerStream stream = tls ? ServerStream(beast::tcp_stream(std::move(socket)), *tls)
                            : ServerStream(beast::tcp_stream(std::move(socket)));
  if (stream.is_tls() && !co_await tls_handshake(stream, client)) co_return;
  if (num_connections.load() > config.max_connections) {
    Request none;
    none.version(11);
    none.keep_alive(false);
    auto response =
        error_response(none, ApiError{503, "too many connections", "service_unavailable", ""});
    co_await write_response(stream, std::move(response), config.write_timeout);
    co_await stream.shutdown(kTlsCloseTimeout);
    co_return;
  }
  // Capped: a header section, a chunk line or trailers past the header limit are a 431.
  beast::flat_buffer buffer(max_unparsed_bytes(config));
  // Known to the drain while it waits for a request: an idle connection is closed then.
  auto waiting = std::make_shared<Idle>();
  waiting->strand = co_await asio::this_coro::executor;
  waiting->stream = &stream;
  waiting->buffer = &buffer;
  {
    std::lock_guard lock(idle_mutex);
    idle.emplace(waiting.get(), waiting);
  }
  struct Forget {  // before stream and buffer are gone (declared after them)
    Impl& impl;
    std::shared_ptr<Idle> waiting;
    ~Forget() {
      waiting->stream = nullptr;
      std::lock_guard lock(impl.idle_mutex);
      impl.idle.erase(waiting.get());
    }
  } forget{*this, waiting};
  for (bool first = true;; first = false) {
    // Draining: no waiting for another request on this connection (its first is read).
    if (!first && draining() && buffer.size() == 0) break;
    RequestParser parser;
    configure_parser(parser, config);
    waiting->parser = &parser;
    const error_code ec = co_await read_request(stream, buffer, parser);
    waiting->parser = nullptr;
    AccessEntry entry;  // from a whole request read: the client's pace before it is its own
    if (ec) {
      const auto error = read_error(ec, config);
      if (!error) break;  // closed, reset or timed out: no one to answer
      if (config.metrics) config.metrics->count_connection_error("bad_request");
      Request req;
      req.version(parser.is_header_done() ? parser.get().version() : 11);
      req.keep_alive(false);
      if (parser.is_header_done()) {
        req.method_string(parser.get().method_string());
        req.target(parser.get().target());
      }
      entry.status = error->status;
      entry.error = error->message;
      log_access(req, entry, client);
      auto response = error_response(req, *error);
      co_await write_response(stream, std::move(response), config.write_timeout);
      co_await linger(stream);
      break;
    }
    Request request = parser.release();
    if (websocket::is_upgrade(request) && route_kind(request) == RouteKind::websocket) {
      std::optional<ApiError> refused = missing_api_key(request, config);
      if (!refused && !is_allowed_origin(request, config.cors)) {
        refused = ApiError{403, "this origin may not open the socket (--allowed-origins)",
                           "permission_error", ""};
      }
      if (!refused && draining()) {  // its generates would all be refused
        refused = ApiError{503, "the server is shutting down and takes no new sockets",
                           "service_unavailable", "", kDrainRetryAfterSeconds};
      }
      if (refused) {
        count(request, refused->status, entry);
        entry.error = refused->message;
        log_access(request, entry, client);
        auto response = error_response(request, *refused);
        co_await write_response(stream, std::move(response), config.write_timeout);
        break;
      }
      entry.status = 101;
      log_access(request, entry, client);  // the upgrade; the socket's requests are its own
      co_await websocket_session(std::move(stream), std::move(request), client);
      co_return;
    }
    bool alive = true;
    if (auto id = client_request_id(request); !id) {
      const ApiError bad_id = id.error();
      alive = co_await refuse(stream, request, bad_id, entry);
    } else {
      entry.request_id = std::move(*id);
      alive = co_await handle(stream, request, entry);
    }
    log_access(request, entry, client);
    if (!alive) break;
  }
  co_await stream.shutdown(kTlsCloseTimeout);
}

asio::awaitable<bool> HttpServer::Impl::tls_handshake(ServerStream& stream,
                                                      const std::string& client) {
  const error_code ec = co_await stream.handshake(config.tls.handshake_timeout);
  if (!ec) co_return true;
  if (config.metrics) config.metrics->count_connection_error("tls_handshake");
  warn("TLS handshake with " + client + " failed (" + tls_failure(ec) + "); connection closed");
  if (is_plain_http(ec)) co_await answer_plain_http(stream);
  co_return false;
}

// Every response is built into a named local before the one co_await that sends it:
// GCC 12 destroys temporaries inside co_await expressions twice.
asio::awaitable<bool> HttpServer::Impl::handle(ServerStream& stream, Request& request,
                                               AccessEntry& entry) {
  // A draining server closes each connection after its answer (Connection: close).
  if (draining()) request.keep_alive(false);
  if (is_generation(request) && is_authorized(request, config)) {
    const bool alive = co_await completions(stream, request, entry);
    co_return alive;
  }
  if (route_kind(request) == RouteKind::engine_events && is_authorized(request, config)) {
    const bool alive = co_await engine_events(stream, request, entry);
    co_return alive;
  }
  Response response;
  if (is_heavy(request)) {  // tokenizing or asking the engine: off this thread
    std::function<Response()> work = [this, &request]() -> Response {
      try {
        return route(request, route_context());
      } catch (const std::exception& e) {
        return error_response(request, ApiError{500, e.what(), "internal_error", ""});
      }
    };
    response = co_await run_on(tokenizer_pool, std::move(work));
  } else {
    response = route(request, route_context());
  }
  count(request, static_cast<int>(response.result_int()), entry);
  if (response.result_int() >= 400) entry.error = error_message(response.body());
  add_cors_headers(request, response, config.cors);
  add_request_id_header(response, entry);
  const bool alive = co_await write_response(stream, std::move(response), config.write_timeout);
  co_return alive;
}

asio::awaitable<bool> HttpServer::Impl::refuse(ServerStream& stream, const Request& request,
                                               const ApiError& error, AccessEntry& entry) {
  count(request, error.status, entry);
  entry.error = error.message;
  // The engine or the server turned a request away for want of room: the operator hears.
  if (error.status == 429 || error.status == 503) warn("refused a request: " + error.message);
  auto response = error_response(request, error);
  add_cors_headers(request, response, config.cors);
  add_request_id_header(response, entry);
  const bool alive = co_await write_response(stream, std::move(response), config.write_timeout);
  co_return alive;
}

Result<void> HttpServer::prepare_descriptor_limit(const ServerConfig& config) {
  const int max_connections = config.max_connections;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return {};
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  const auto needed = static_cast<rlim_t>(std::max(max_connections, 0)) + kReservedDescriptors;
  if (limit.rlim_cur != RLIM_INFINITY && needed > limit.rlim_cur) {
    return make_error(ErrorCode::invalid_argument,
                      "--max-connections " + std::to_string(max_connections) + " needs about " +
                          std::to_string(needed) + " file descriptors, but this process may open " +
                          std::to_string(limit.rlim_cur) +
                          " (its hard limit): raise `ulimit -n` or lower --max-connections");
  }
  return {};
}

HttpServer::HttpServer(Engine& engine, ServerConfig config)
    : impl_(std::make_unique<Impl>(engine, std::move(config))) {}

HttpServer::~HttpServer() {
  stop();
}

namespace {

// host:port bound and listening on `acceptor`.
Result<void> bind_acceptor(tcp::acceptor& acceptor, const std::string& host, std::uint16_t port) {
  error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec)
    return make_error(ErrorCode::invalid_argument, "bad host '" + host + "': " + ec.message());
  const tcp::endpoint endpoint(address, port);
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error(ErrorCode::io, "cannot listen on " + host + ":" + std::to_string(port) +
                                         ": " + ec.message());
  }
  return {};
}

}  // namespace

Result<int> bind_listener(const std::string& host, std::uint16_t port) {
  asio::io_context io;
  tcp::acceptor acceptor(io);
  TROUPE_TRY_VOID(bind_acceptor(acceptor, host, port));
  error_code ec;
  const int fd = acceptor.release(ec);
  if (ec) return make_error(ErrorCode::io, "cannot hand the listening socket on: " + ec.message());
  return fd;
}

Result<void> HttpServer::start() {
  auto& impl = *impl_;
  TROUPE_TRY_VOID(prepare_descriptor_limit(impl.config));
  if (impl.config.tls.enabled()) {
    TROUPE_TRY(impl.tls, make_tls_context(impl.config.tls));
  }
  impl.acceptor = std::make_unique<tcp::acceptor>(impl.io);
  if (impl.config.listen_fd >= 0) {
    // Bound before the model loaded (bind_listener): the server takes it over.
    const int fd = std::exchange(impl.config.listen_fd, -1);  // the acceptor's from here
    error_code ec;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    const bool v6 = ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
                    local.ss_family == AF_INET6;
    impl.acceptor->assign(v6 ? tcp::v6() : tcp::v4(), fd, ec);
    if (ec) {
      ::close(fd);
      return make_error(ErrorCode::io, "cannot take the listening socket: " + ec.message());
    }
  } else {
    TROUPE_TRY_VOID(bind_acceptor(*impl.acceptor, impl.config.host, impl.config.port));
  }
  asio::co_spawn(impl.io, impl.listen(), [&impl](std::exception_ptr e) {
    if (e) impl.warn("the accept loop ended on an exception: no new connections");
  });
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
  impl.tokenizer_pool.stop();
  impl.tokenizer_pool.join();
  impl.grammar_pool.stop();
  impl.grammar_pool.join();
}

void HttpServer::drain(const std::string& why) {
  impl_->begin_drain(why);
}

bool HttpServer::draining() const {
  return impl_->draining();
}

bool HttpServer::drained() const {
  return impl_->drain->num_live() == 0 && impl_->drain->closing_sockets.load() == 0;
}

int HttpServer::num_generations() const {
  return impl_->drain->num_live();
}

void HttpServer::cut_generations() {
  impl_->cut_generations();
}

std::uint16_t HttpServer::port() const {
  return impl_->acceptor ? impl_->acceptor->local_endpoint().port() : impl_->config.port;
}

const text::ChatTemplate& HttpServer::chat_template() const {
  return *impl_->context.chat_template;
}

std::string_view HttpServer::tool_call_parser() const {
  return tool_call_format_name(impl_->context.tool_call_format);
}

int HttpServer::num_connections() const {
  return impl_->num_connections.load();
}

int HttpServer::num_requests_in_flight() const {
  return impl_->admission->in_flight.load();
}

}  // namespace troupe::net
