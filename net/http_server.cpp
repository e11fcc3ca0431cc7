// The accept loop and HTTP sessions as coroutines: requests read within limits, plain
// routes, and generation answered as one JSON object or as server-sent events.
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
#include "net/choice_text.hpp"
#include "net/cors.hpp"
#include "net/responses_api.hpp"
#include "net/server_impl.hpp"
#include "net/structured_output.hpp"
#include "text/unicode.hpp"
#include "troupe/background_priority.hpp"

namespace troupe::net {

namespace {

// Descriptors the process needs besides its connections: the listener, the engine's
// actor system, the model file, stdio, the tokenizer and I/O threads' wake-ups.
constexpr rlim_t kReservedDescriptors = 64;

std::int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Writes a response; false when the client is gone or the connection ends with it.
asio::awaitable<bool> send(beast::tcp_stream& stream, Response res, std::chrono::seconds timeout) {
  stream.expires_after(timeout);
  auto [ec, n] = co_await http::async_write(stream, res, kUseTuple);
  co_return !ec && res.keep_alive();
}

// An error answer to a request not read to its end (a body past the limit, say) leaves
// the client sending: closing with its bytes unread resets the connection, and a client
// that reads only once it has sent everything (Python's http.client, requests) never sees
// the answer. As nginx's lingering close: the sending side is shut, and what still comes
// is read and dropped, for at most kLingerTime (kLingerIdle without a byte) and
// kLingerBytes.
constexpr std::chrono::seconds kLingerTime{5};
constexpr std::chrono::seconds kLingerIdle{1};
constexpr std::size_t kLingerBytes = std::size_t{32} << 20;

asio::awaitable<void> linger(beast::tcp_stream& stream) {
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

// One generation over HTTP: what its engine callbacks and its connection share.
struct Generation {
  std::shared_ptr<EventChannel> channel;
  std::shared_ptr<Admission> admission;
  std::atomic<int> num_open{0};  // choices not yet ended in the engine
  OutputBound output;
  // Touched on the connection's strand only.
  std::vector<RequestId> ids;
  beast::tcp_stream* stream = nullptr;  // while the coroutine holds it
  bool done = false;                    // the answer is complete: stop watching
  bool client_gone = false;

  explicit Generation(std::size_t max_output) : output(max_output) {}
};

// Cancels every request of a generation (on its strand).
void cancel_all(Engine& engine, Generation& g) {
  for (RequestId id : g.ids) engine.cancel(id);
}

// Watches the socket while a generation runs: EOF or a reset means the client is gone,
// and its requests are cancelled now instead of when the answer cannot be written.
// Bytes from the client (its next request, pipelined) mean it is still there.
void watch_for_disconnect(Engine& engine, tcp::socket& socket, std::shared_ptr<Generation> g) {
  // The socket outlives every completion but a cancelled one, which touches nothing.
  auto on_readable = [&engine, &socket, g](error_code ec) {
    if (ec || g->done) return;  // cancelled: the answer is complete, or the socket closed
    char byte = 0;
    const auto n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      watch_for_disconnect(engine, socket, g);
      return;
    }
    g->client_gone = true;
    cancel_all(engine, *g);
  };
  socket.async_wait(tcp::socket::wait_read, std::move(on_readable));
}

// The peer's address and port, for the log ("-" once it is gone).
std::string peer_name(const tcp::socket& socket) {
  error_code ec;
  const auto peer = socket.remote_endpoint(ec);
  if (ec) return "-";
  return peer.address().to_string() + ":" + std::to_string(peer.port());
}

}  // namespace

void AccessEntry::ended(const TokenEvent& end, std::string_view reason) {
  output_tokens = std::max<std::int64_t>(output_tokens, 0) + end.num_generated_tokens;
  if (finish_reason.empty()) {
    finish_reason = reason;
  } else if (finish_reason.find(reason) == std::string::npos) {
    finish_reason += ",";
    finish_reason += reason;
  }
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
  context.priority_scheduling = engine.scheduling_policy() == BatchingPolicy::priority;
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
    r.replicas_up = [this] {
      return std::make_pair(engine.num_replicas_up(), engine.num_replicas());
    };
    r.cluster_json = [this] { return cluster_json(engine.nodes(), engine.replicas()); };
  }
  return r;
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

void HttpServer::Impl::count(const Request& request, int status, AccessEntry& entry) {
  entry.status = status;
  if (config.metrics) config.metrics->count_http(route_label(request_path(request)), status);
}

bool HttpServer::Impl::access_logged() const {
  return config.access_log && monitoring::log_enabled(monitoring::LogLevel::info);
}

void HttpServer::Impl::log_access(const Request& request, const AccessEntry& e,
                                  std::string_view client) const {
  log_access(request.method_string(), request_path(request), e, client);
}

void HttpServer::Impl::log_access(std::string_view method, std::string_view full_path,
                                  const AccessEntry& e, std::string_view client) const {
  if (!access_logged()) return;
  // A path or an id is the client's to choose: keep a line a line.
  constexpr std::size_t kMostClientBytes = 256;
  const std::string_view path = full_path.substr(0, kMostClientBytes);
  const std::string_view request_id = std::string_view(e.request_id).substr(0, kMostClientBytes);
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - e.start).count();
  using monitoring::LogField;
  const auto count_or_none = [](std::string_view key, std::int64_t n) {
    return n < 0 ? LogField(key, nullptr) : LogField(key, n);
  };
  // A refusal says why (its error's message, bounded as the client's text is).
  const std::string_view error = std::string_view(e.error).substr(0, kMostClientBytes);
  const LogField fields[] = {
      {"method", method},
      {"path", path},
      {"status", e.status},
      request_id.empty() ? LogField("request_id", nullptr) : LogField("request_id", request_id),
      count_or_none("prompt_tokens", e.prompt_tokens),
      count_or_none("output_tokens", e.output_tokens),
      e.ttft_seconds ? LogField("ttft_ms", *e.ttft_seconds * 1e3) : LogField("ttft_ms", nullptr),
      {"total_ms", total * 1e3},
      e.finish_reason.empty() ? LogField("finish_reason", nullptr)
                              : LogField("finish_reason", e.finish_reason),
      {"client_gone", e.client_gone},
      {"client", client},
      {"error", error},
  };
  // The reason only on a refusal's line: a served request's line is as it was.
  const std::size_t num_fields = std::size(fields) - (e.status >= 400 && !error.empty() ? 0 : 1);
  monitoring::log(monitoring::LogLevel::info, "request",
                  std::span<const monitoring::LogField>(fields, num_fields));
}

void HttpServer::Impl::warn(const std::string& message) {
  std::lock_guard lock(warn_mutex);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_warning < std::chrono::seconds(1)) {
    ++num_suppressed_warnings;
    return;
  }
  last_warning = now;
  if (num_suppressed_warnings > 0) {
    monitoring::log_warning(message, {{"suppressed_in_last_second", num_suppressed_warnings}});
  } else {
    monitoring::log_warning(message);
  }
  num_suppressed_warnings = 0;
}

void HttpServer::Impl::on_session_exception(std::exception_ptr error) {
  if (!error) return;
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  if (config.metrics) config.metrics->count_connection_error("exception");
  warn("a connection ended on an exception (" + what + "); the server goes on");
}

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

asio::awaitable<error_code> HttpServer::Impl::read_request(beast::tcp_stream& stream,
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
  beast::tcp_stream stream(std::move(socket));
  if (num_connections.load() > config.max_connections) {
    Request none;
    none.version(11);
    none.keep_alive(false);
    auto response =
        error_response(none, ApiError{503, "too many connections", "service_unavailable", ""});
    co_await send(stream, std::move(response), config.write_timeout);
    co_return;
  }
  // Capped: a header section, a chunk line or trailers past the header limit are a 431.
  beast::flat_buffer buffer(max_unparsed_bytes(config));
  while (true) {
    RequestParser parser;
    configure_parser(parser, config);
    const error_code ec = co_await read_request(stream, buffer, parser);
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
      co_await send(stream, std::move(response), config.write_timeout);
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
      if (refused) {
        count(request, refused->status, entry);
        entry.error = refused->message;
        log_access(request, entry, client);
        auto response = error_response(request, *refused);
        co_await send(stream, std::move(response), config.write_timeout);
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
  error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

// Every response is built into a named local before the one co_await that sends it:
// GCC 12 destroys temporaries inside co_await expressions twice.
asio::awaitable<bool> HttpServer::Impl::handle(beast::tcp_stream& stream, Request& request,
                                               AccessEntry& entry) {
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
  const bool alive = co_await send(stream, std::move(response), config.write_timeout);
  co_return alive;
}

asio::awaitable<bool> HttpServer::Impl::refuse(beast::tcp_stream& stream, const Request& request,
                                               const ApiError& error, AccessEntry& entry) {
  count(request, error.status, entry);
  entry.error = error.message;
  // The engine or the server turned a request away for want of room: the operator hears.
  if (error.status == 429 || error.status == 503) warn("refused a request: " + error.message);
  auto response = error_response(request, error);
  add_cors_headers(request, response, config.cors);
  add_request_id_header(response, entry);
  const bool alive = co_await send(stream, std::move(response), config.write_timeout);
  co_return alive;
}

asio::awaitable<std::optional<ApiError>> HttpServer::Impl::check_constraint(
    const CompletionRequest& request) {
  if (request.generate.params.grammar.empty() || !context.token_masker) co_return std::nullopt;
  std::function<std::string()> probe = [this, &request]() -> std::string {
    static thread_local const bool lowered = (lower_this_thread_priority(), true);
    (void)lowered;
    try {
      return first_mask_refusal(request.generate.params.grammar, *context.token_masker);
    } catch (const std::exception& e) {
      return e.what();
    }
  };
  std::string why = co_await run_on(grammar_pool, std::move(probe));
  if (why.empty()) co_return std::nullopt;
  co_return bad_request("'" + request.grammar_param + "': " + why, request.grammar_param);
}

asio::awaitable<bool> HttpServer::Impl::completions(beast::tcp_stream& stream, Request& request,
                                                    AccessEntry& entry) {
  const RouteKind kind = route_kind(request);
  const bool chat = kind == RouteKind::chat_completion;
  using Parsed = tl::expected<CompletionRequest, ApiError>;
  std::function<Parsed()> parse = [this, &request, kind]() -> Parsed {
    try {
      return kind == RouteKind::responses ? parse_responses_request(request.body(), context)
             : kind == RouteKind::chat_completion
                 ? parse_chat_request(request.body(), context)
                 : parse_completion_request(request.body(), context);
    } catch (const std::exception& e) {
      return tl::unexpected(ApiError{500, e.what(), "internal_error", ""});
    }
  };
  Parsed parsed = co_await run_on(tokenizer_pool, std::move(parse));
  if (!parsed) {
    const bool alive = co_await refuse(stream, request, parsed.error(), entry);
    co_return alive;
  }
  const std::optional<ApiError> costly = co_await check_constraint(*parsed);
  if (costly) {
    const bool alive = co_await refuse(stream, request, *costly, entry);
    co_return alive;
  }
  const CompletionRequest& completion = *parsed;
  const std::string id = (completion.responses() ? "resp_"
                          : chat                 ? "chatcmpl-"
                                                 : "cmpl-") +
                         std::to_string(next_completion.fetch_add(1));
  const std::int64_t created = unix_time();
  if (entry.request_id.empty()) entry.request_id = id;  // else the client's X-Request-Id
  entry.prompt_tokens = 0;
  for (int p = 0; p < completion.num_prompts(); ++p) {
    entry.prompt_tokens += static_cast<std::int64_t>(completion.prompt(p).size());
  }
  // Sequences run, prompt-major.
  const int per_prompt = completion.sequences_per_prompt();
  const int num_sequences = completion.num_prompts() * per_prompt;

  // Admission: past the limit, the client should come back later.
  if (!admission->try_acquire()) {
    const ApiError busy{429,
                        "the server has " + std::to_string(config.max_concurrent_requests) +
                            " requests in flight: try again later",
                        "rate_limit_error", ""};
    const bool alive = co_await refuse(stream, request, busy, entry);
    co_return alive;
  }

  // Engine events cross into this coroutine through a channel; the engine never blocks.
  auto g = std::make_shared<Generation>(config.max_buffered_output_bytes);
  g->channel = std::make_shared<EventChannel>(co_await asio::this_coro::executor, 1024);
  g->admission = admission;
  g->num_open = num_sequences;
  g->stream = &stream;
  struct Detach {  // the callbacks may outlive this coroutine: they must not see the stream
    Generation& g;
    ~Detach() { g.stream = nullptr; }
  } detach{*g};
  auto strand = co_await asio::this_coro::executor;
  TokenCallback on_event = [g, gate = gate, strand, this](const TokenEvent& e) {
    // The slot is freed when the request ends here, in the engine, not when written.
    if (e.finished && g->num_open.fetch_sub(1) == 1) g->admission->release();
    std::lock_guard lock(gate->mutex);
    if (!gate->open) return;
    if (g->output.add(event_bytes(e))) {
      // The client has fallen too far behind: cancel and close on its strand.
      asio::post(strand, [g, this] {
        if (config.metrics) config.metrics->count_connection_error("slow_reader");
        cancel_all(engine, *g);
        if (g->stream != nullptr) g->stream->cancel();
      });
    }
    if (g->output.over()) return;
    if (!g->channel->try_send(error_code{}, e))
      g->channel->async_send(error_code{}, e, [](error_code) {});
  };
  // Each choice (or candidate) is an engine request of its prompt; their events share the
  // channel. A prompt's i-th sequence has the seed plus i, as it would alone.
  for (int s = 0; s < num_sequences; ++s) {
    GenerateRequest generate = completion.generate;
    const int i = s % per_prompt;
    if (completion.num_prompts() > 1) {
      generate.prompt = completion.prompt(static_cast<std::size_t>(s / per_prompt));
    }
    if (generate.params.seed && i > 0) *generate.params.seed += static_cast<std::uint64_t>(i);
    auto submitted = engine.submit(std::move(generate), on_event);
    if (!submitted) {
      cancel_all(engine, *g);
      // The sequences never submitted will never end: give their share back now.
      if (g->num_open.fetch_sub(num_sequences - s) == num_sequences - s) admission->release();
      const ApiError refused = api_error(submitted.error());
      const bool alive = co_await refuse(stream, request, refused, entry);
      co_return alive;
    }
    g->ids.push_back(*submitted);
  }
  auto index_of = [&g](RequestId rid) {
    return static_cast<int>(std::find(g->ids.begin(), g->ids.end(), rid) - g->ids.begin());
  };
  watch_for_disconnect(engine, stream.socket(), g);
  auto stop_watching = [&g, &stream] {
    g->done = true;
    error_code ignored;
    stream.socket().cancel(ignored);
  };
  int num_open = num_sequences;

  if (!completion.stream) {
    std::vector<CompletionOutput> outputs(static_cast<std::size_t>(num_sequences));
    for (int s = 0; s < num_sequences; ++s) {
      outputs[static_cast<std::size_t>(s)].prompt_index = static_cast<std::size_t>(s / per_prompt);
    }
    std::optional<ApiError> failure;
    while (num_open > 0 && !g->output.over()) {
      auto [ec, event] = co_await g->channel->async_receive(kUseTuple);
      if (ec) break;
      g->output.remove(event_bytes(event));
      if (completion.score_only) drop_scoring_token(event);
      CompletionOutput& output = outputs[index_of(event.request_id)];
      output.text += event.text;
      if (!event.prompt_logprobs.empty()) output.prompt_logprobs = std::move(event.prompt_logprobs);
      if (event.token != kNoToken) {
        entry.first_token();
        output.cumulative_logprob += event.logprob;
      }
      if (event.token != kNoToken && completion.want_logprobs) output.tokens.push_back(event);
      if (event.finished) {
        entry.ended(event, openai_finish_reason(event.finish_reason));
        if (event.finish_reason == FinishReason::error) failure = api_error(event);
        output.end = std::move(event);
        --num_open;
      }
    }
    stop_watching();
    if (g->client_gone || g->output.over()) {
      entry.client_gone = true;
      entry.status = 499;  // nginx's "client closed request": no answer was sent
      g->channel->close();
      co_return false;
    }
    if (failure) {
      const bool alive = co_await refuse(stream, request, *failure, entry);
      co_return alive;
    }
    std::string body = completion.responses()
                           ? responses_response(context, id, created, completion, outputs.front())
                           : completion_response(context, id, created, completion,
                                                 best_choices(completion, std::move(outputs)));
    auto response = make_response(request, http::status::ok, std::move(body));
    count(request, 200, entry);
    add_cors_headers(request, response, config.cors);
    add_request_id_header(response, entry);
    const bool alive = co_await send(stream, std::move(response), config.write_timeout);
    co_return alive;
  }

  // Server-sent events: one chunk per event, then usage and [DONE] after the last choice.
  // HTTP/1.0 has no chunked encoding: its stream is the body up to the connection's close.
  const bool chunked = request.version() >= 11;
  http::response<http::empty_body> head{http::status::ok, request.version()};
  head.set(http::field::server, "troupe");
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.chunked(chunked);
  head.keep_alive(chunked && request.keep_alive());
  add_cors_headers(request, head, config.cors);
  add_request_id_header(head, entry);
  http::response_serializer<http::empty_body> serializer{head};
  count(request, 200, entry);
  stream.expires_after(config.write_timeout);
  auto [head_ec, head_n] = co_await http::async_write_header(stream, serializer, kUseTuple);
  bool alive = !head_ec;
  std::string data;
  auto write_data = [&]() -> asio::awaitable<bool> {
    stream.expires_after(config.write_timeout);
    if (chunked) {
      const auto chunk = http::make_chunk(asio::buffer(data));
      auto [wec, wn] = co_await asio::async_write(stream, chunk, kUseTuple);
      co_return !wec;
    }
    auto [wec, wn] = co_await asio::async_write(stream, asio::buffer(data), kUseTuple);
    co_return !wec;
  };
  // A response streams its own events (net/responses_api.hpp), opened by response.created.
  std::optional<ResponsesStream> responses;
  if (completion.responses()) responses.emplace(context, id, created, completion);
  if (alive && responses) {
    data = responses->start();
    alive = co_await write_data();
  } else if (alive && completion.chat) {  // a chat stream opens each choice with its role
    data.clear();
    for (int i = 0; i < num_sequences; ++i) {
      data += "data: " + chat_role_chunk(context, id, created, i) + "\n\n";
    }
    alive = co_await write_data();
  }
  Usage usage;
  // A chat whose text is read (thinking apart, tool calls) holds back what may be a marker
  // or a call: a call until its choice ends.
  std::vector<ChoiceTextStream> reads;
  if (completion.chat && !responses && ChoiceTextStream(completion).reads()) {
    reads.assign(static_cast<std::size_t>(num_sequences), ChoiceTextStream(completion));
  }
  // echo: a choice's prompt goes out before its first token (with the prompt's logprobs,
  // which come with that first event).
  std::vector<bool> echoed(static_cast<std::size_t>(num_sequences), !completion.echo);
  std::vector<std::size_t> sent_bytes(static_cast<std::size_t>(num_sequences), 0);  // text_offset
  while (alive && num_open > 0 && !g->output.over()) {
    auto [ec, event] = co_await g->channel->async_receive(kUseTuple);
    if (ec) break;
    const int index = index_of(event.request_id);
    const std::size_t bytes = event_bytes(event);
    if (completion.score_only) drop_scoring_token(event);
    if (event.token != kNoToken) entry.first_token();
    data.clear();
    if (responses) {  // one sequence: its events say all, with no [DONE] after them
      data = responses->take(event);
      if (event.finished) {
        --num_open;
        entry.ended(event, openai_finish_reason(event.finish_reason));
      }
      if (!data.empty()) alive = co_await write_data();
      g->output.remove(bytes);
      continue;
    }
    if (!echoed[static_cast<std::size_t>(index)]) {
      echoed[static_cast<std::size_t>(index)] = true;
      const auto prompt_index = static_cast<std::size_t>(index / per_prompt);
      data +=
          "data: " +
          echo_chunk(context, id, created, completion, prompt_index, event.prompt_logprobs, index) +
          "\n\n";
      sent_bytes[static_cast<std::size_t>(index)] = completion.prompt_texts[prompt_index].size();
    }
    bool called = false;
    bool thought_only = false;  // the event's text was all thinking: its chunk carries it
    if (!reads.empty()) {
      ChoiceText shown = reads[static_cast<std::size_t>(index)].take(event.text, event.finished);
      event.text = std::move(shown.content);
      called = !shown.calls.empty();
      if (!shown.reasoning.empty()) {
        data += "data: " + reasoning_chunk(context, id, created, shown.reasoning, index) + "\n\n";
      }
      if (!shown.deltas.empty()) {
        data += "data: " + tool_calls_chunk(context, id, created, shown.deltas, index) + "\n\n";
      }
      if (!called && !event.finished && event.text.empty() && !completion.want_logprobs) {
        if (data.empty()) {
          g->output.remove(bytes);
          continue;  // held: nothing to send yet
        }
        thought_only = true;
      }
    }
    if (!thought_only) {
      data += "data: " +
              completion_chunk(context, id, created, completion, event, index, called,
                               sent_bytes[static_cast<std::size_t>(index)]) +
              "\n\n";
    }
    sent_bytes[static_cast<std::size_t>(index)] += event.text.size();
    if (event.finished) {
      --num_open;
      usage.completion_tokens += event.num_generated_tokens;
      if (index % per_prompt == 0) {  // each prompt once
        usage.prompt_tokens += event.num_prompt_tokens;
        usage.cached_tokens += event.num_cached_tokens;
      }
      entry.ended(event, openai_finish_reason(event.finish_reason, called));
      // Cut short by a failure (a lost node mid-stream): the client hears why, as an
      // error event after the choice's last chunk (finish_reason "error").
      if (event.finish_reason == FinishReason::error) {
        data += "data: " + error_json(api_error(event)) + "\n\n";
      }
      if (num_open == 0 && completion.include_usage) {
        data += "data: " + usage_chunk(context, id, created, completion, usage) + "\n\n";
      }
      if (num_open == 0) data += "data: [DONE]\n\n";
    }
    // A client that went away is seen when a write fails (or by the watch): cancel then.
    alive = co_await write_data();
    g->output.remove(bytes);
  }
  stop_watching();
  if (!alive || g->client_gone || g->output.over()) {
    entry.client_gone = true;
    cancel_all(engine, *g);
    g->channel->close();
    co_return false;
  }
  if (!chunked) co_return false;  // the close ends the body
  stream.expires_after(config.write_timeout);
  const auto last = http::make_chunk_last();
  auto [lec, ln] = co_await asio::async_write(stream, last, kUseTuple);
  co_return !lec && request.keep_alive();
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
