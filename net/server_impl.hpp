// The server's insides, shared by its session files (http_server.cpp: accept loop, TLS
// handshake, plain routes; completion_session.cpp: generation, JSON or SSE;
// engine_events.cpp: the live page's stream; websocket_session.cpp: /v1/ws;
// generation_stream.cpp: a generation's events, for SSE and the socket alike;
// event_stream.cpp: an SSE response's head and chunks; access_log.cpp: the log). Not for other
// rooms: it pulls in Beast and OpenSSL.
#pragma once

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/experimental/concurrent_channel.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "monitoring/metrics.hpp"
#include "net/http_routes.hpp"
#include "net/http_server.hpp"
#include "net/openai_api.hpp"
#include "net/tls_stream.hpp"

namespace troupe::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Strand = asio::strand<asio::io_context::executor_type>;
using EventChannel = asio::experimental::concurrent_channel<void(error_code, TokenEvent)>;

inline constexpr auto kUseTuple = asio::as_tuple(asio::use_awaitable);

// Engine callbacks outlive nothing of the server: once the gate is shut (stop()),
// they drop their events instead of touching a channel whose io_context is gone.
struct CallbackGate {
  std::mutex mutex;
  bool open = true;
};

// Generation requests admitted at once (HTTP and WebSocket). A slot is freed when its
// request ends in the engine, whatever became of its output.
struct Admission {
  explicit Admission(int most) : limit(most) {}
  bool try_acquire() {
    if (in_flight.fetch_add(1) >= limit) {
      in_flight.fetch_sub(1);
      return false;
    }
    return true;
  }
  void release() { in_flight.fetch_sub(1); }
  const int limit;
  std::atomic<int> in_flight{0};
};

class GenerationStream;  // net/generation_stream.hpp
struct WsConnection;     // net/websocket_session.cpp

// What a draining server tells the clients it refuses: try again after this many seconds
// (their load balancer sends them elsewhere meanwhile).
inline constexpr int kDrainRetryAfterSeconds = 5;

// The server's drain (SIGTERM, POST /v1/admin/drain). From its start no generation is
// admitted (GenerationStream::start, under the mutex, so that none slips in after); the
// generations that run are known until their transport is done with them, so that what
// is left at the shutdown timeout can be cut, each still ending properly.
struct Drain {
  std::mutex mutex;
  bool draining = false;  // under the mutex
  std::atomic<bool> started{false};
  // Running generations, registered by start() and dropped by finished().
  std::unordered_map<const GenerationStream*, std::weak_ptr<GenerationStream>> live;
  // WebSocket connections told to go away (close 1001) that have not closed yet: each is
  // counted when the drain reaches it and uncounted when it is gone.
  std::atomic<int> closing_sockets{0};
  int num_live() {
    std::lock_guard lock(mutex);
    return static_cast<int>(live.size());
  }
};

// Output of one connection that its client has not taken yet, in bytes: engine callbacks
// add, the writer takes away once written. Crossing the bound happens once; the caller
// that crossed it ends the connection.
struct OutputBound {
  explicit OutputBound(std::size_t most) : limit(static_cast<std::int64_t>(most)) {}
  // True when these bytes crossed the bound (the caller acts, once); false otherwise,
  // and always after the bound was crossed (the output is dropped from then on).
  bool add(std::int64_t n) {
    if (overflowed.load()) return false;
    return bytes.fetch_add(n) + n > limit && !overflowed.exchange(true);
  }
  void remove(std::int64_t n) { bytes.fetch_sub(n); }
  bool over() const { return overflowed.load(); }
  const std::int64_t limit;
  std::atomic<std::int64_t> bytes{0};
  std::atomic<bool> overflowed{false};
};

// The memory a queued engine event holds.
// A prompt-scoring request's (echo, max_tokens 0) event without the one token the engine
// had to generate: no text, no token, no logprobs of it, and it ended at its length.
inline void drop_scoring_token(TokenEvent& e) {
  e.token = kNoToken;
  e.text.clear();
  e.logprob = 0.0f;
  e.top_logprobs.clear();
  if (e.finished) {
    e.num_generated_tokens = 0;
    if (e.finish_reason == FinishReason::stop) e.finish_reason = FinishReason::length;
  }
}

inline std::int64_t event_bytes(const TokenEvent& e) {
  return static_cast<std::int64_t>(sizeof(TokenEvent) + e.text.size() + e.error.size() +
                                   e.top_logprobs.size() * sizeof(TokenLogprob));
}

// Runs `work` on `pool` and resumes the calling coroutine on its own executor with the
// result. The work must not throw (wrap it): nothing could catch it on the pool.
template <class T>
asio::awaitable<T> run_on(asio::thread_pool& pool, std::function<T()> work) {
  // GCC 12 destroys a lambda written inside a co_await expression twice: name it first.
  auto initiate = [&pool, work = std::move(work)](auto handler) mutable {
    asio::post(pool, [work = std::move(work), handler = std::move(handler)]() mutable {
      T result = work();
      auto executor = asio::get_associated_executor(handler);
      asio::post(executor, [handler = std::move(handler), result = std::move(result)]() mutable {
        std::move(handler)(std::move(result));
      });
    });
  };
  auto token = asio::use_awaitable;
  co_return co_await asio::async_initiate<decltype(token), void(T)>(std::move(initiate), token);
}

struct WsConnection;

// Writes a response; false when the client is gone or the connection ends with it.
asio::awaitable<bool> write_response(ServerStream& stream, Response res,
                                     std::chrono::seconds timeout);

// What one HTTP request was and what became of it: its line in the access log.
struct AccessEntry {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  int status = 0;
  // The client's X-Request-Id when it sent one (echoed in the response's header), else a
  // generation's own (cmpl-N, chatcmpl-N).
  std::string request_id;
  std::string error;                // why the request was refused (a 4xx or 5xx)
  std::int64_t prompt_tokens = -1;  // -1: not a generation, or refused before tokenizing
  std::int64_t output_tokens = -1;
  std::optional<double> ttft_seconds;
  std::string finish_reason;  // the choices' reasons, "," between different ones
  bool client_gone = false;   // the client left before its answer was complete

  void first_token() {
    if (!ttft_seconds) {
      ttft_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  }
  // A choice ended: its tokens and reason count.
  void ended(const TokenEvent& end, std::string_view reason);
};

// The longest X-Request-Id taken: a request's id goes into its response and the log.
inline constexpr std::size_t kMostRequestIdBytes = 256;

// The client's X-Request-Id: none (empty), or the id when it is 1 to kMostRequestIdBytes
// printable ASCII characters; anything else is the client's error (a 400 naming it).
inline tl::expected<std::string, ApiError> client_request_id(const Request& request) {
  const auto it = request.find("X-Request-Id");
  if (it == request.end()) return std::string();
  const std::string_view id = it->value();
  const bool printable = std::all_of(id.begin(), id.end(), [](char c) {
    return static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
  });
  if (id.empty() || id.size() > kMostRequestIdBytes || !printable) {
    return tl::unexpected(ApiError{400,
                                   "the X-Request-Id header must be 1 to " +
                                       std::to_string(kMostRequestIdBytes) +
                                       " printable ASCII characters",
                                   "invalid_request_error", "X-Request-Id"});
  }
  return std::string(id);
}

// The request's id as the response's X-Request-Id header (vLLM's), when it has one.
template <class Response>
void add_request_id_header(Response& response, const AccessEntry& entry) {
  if (!entry.request_id.empty()) response.set("X-Request-Id", entry.request_id);
}

struct HttpServer::Impl {
  Impl(Engine& e, ServerConfig c);

  Engine& engine;
  ServerConfig config;
  ApiContext context;
  std::shared_ptr<CallbackGate> gate = std::make_shared<CallbackGate>();
  std::shared_ptr<Admission> admission;
  std::shared_ptr<Drain> drain = std::make_shared<Drain>();
  // Connections waiting for their next request, closed when the drain starts (on their
  // strands, and only when nothing of a request has arrived).
  struct Idle {
    asio::any_io_executor strand;
    ServerStream* stream = nullptr;  // null once the connection is gone
    const beast::flat_buffer* buffer = nullptr;
    const RequestParser* parser = nullptr;  // set while in read_request
  };
  std::mutex idle_mutex;
  std::unordered_map<const Idle*, std::shared_ptr<Idle>> idle;
  // Open WebSocket connections, told to go away when the drain starts (sockets_mutex).
  std::mutex sockets_mutex;
  std::unordered_map<const WsConnection*, std::weak_ptr<WsConnection>> sockets;
  asio::io_context io;
  std::unique_ptr<tcp::acceptor> acceptor;
  // Set when the server speaks HTTPS (config.tls): every connection's handshake uses it.
  std::shared_ptr<asio::ssl::context> tls;
  std::vector<std::thread> threads;
  // Declared after io: it is destroyed first, so no tokenizing outlives the io_context.
  asio::thread_pool tokenizer_pool;
  // One thread for output constraints' first masks (check_constraint): up to a second each,
  // so costly constraints wait for each other there, never plain requests' parsing; at a
  // lower priority than the forward pass (troupe/background_priority.hpp).
  asio::thread_pool grammar_pool{1};
  std::atomic<int> num_connections{0};
  std::atomic<std::uint64_t> next_completion{1};
  std::mutex warn_mutex;
  std::chrono::steady_clock::time_point last_warning{};
  int num_suppressed_warnings = 0;

  asio::awaitable<void> listen();
  asio::awaitable<void> session(tcp::socket socket);
  // The TLS handshake of a connection to an HTTPS server; false (and logged, and a plain
  // HTTP client answered) when it failed: the connection ends.
  asio::awaitable<bool> tls_handshake(ServerStream& stream, const std::string& client);
  // Reads one request into `parser` (answering Expect: 100-continue); the error it ended on.
  asio::awaitable<error_code> read_request(ServerStream& stream, beast::flat_buffer& buffer,
                                           RequestParser& parser);
  asio::awaitable<bool> handle(ServerStream& stream, Request& request, AccessEntry& entry);
  asio::awaitable<bool> completions(ServerStream& stream, Request& request, AccessEntry& entry);
  // The request's output constraint, if any, checked on grammar_pool: its first token mask
  // within the work budget (first_mask_refusal). A 400 naming its field, or nothing.
  asio::awaitable<std::optional<ApiError>> check_constraint(const CompletionRequest& request);
  // Answers with an error and counts it; false when the connection ends with it. The
  // error must be a named local of the caller: GCC 12 destroys temporaries in co_await twice.
  asio::awaitable<bool> refuse(ServerStream& stream, const Request& request, const ApiError& error,
                               AccessEntry& entry);
  // GET /v1/engine/events: the engine's steps as server-sent events until the client
  // leaves (false: the connection ends with it).
  asio::awaitable<bool> engine_events(ServerStream& stream, const Request& request,
                                      AccessEntry& entry);
  // The socket's requests are logged one line each, like HTTP's, from `client`.
  asio::awaitable<void> websocket_session(ServerStream stream, Request request, std::string client);
  asio::awaitable<void> websocket_writer(std::shared_ptr<WsConnection> connection);
  asio::awaitable<void> websocket_command(std::shared_ptr<WsConnection> connection,
                                          std::string text);
  // One generate's events framed, in order, until it ends; then its line in the log.
  asio::awaitable<void> websocket_stream(std::shared_ptr<WsConnection> connection,
                                         std::shared_ptr<GenerationStream> generation,
                                         std::string id, bool want_logprobs,
                                         std::shared_ptr<AccessEntry> entry);
  void websocket_overflow(const std::shared_ptr<WsConnection>& connection);
  // The drain reached the connection (on its strand): it closes with 1001 (going away)
  // once its requests have ended, at once when it has none.
  void websocket_going_away(const std::shared_ptr<WsConnection>& connection);
  // Tells every open WebSocket connection to go away (begin_drain).
  void sockets_go_away();

  RouteContext route_context();
  // Starts the drain, once: no generation is admitted from now on, /health answers 503,
  // idle connections close and every answer closes its connection. `why` is logged.
  void begin_drain(const std::string& why);
  // Cuts every generation still running (on its strand): each ends as an error (503).
  void cut_generations();
  bool draining() const { return drain->started.load(); }
  // Counts a response in troupe_http_requests_total and keeps its status for the log.
  void count(const Request& request, int status, AccessEntry& entry);
  // The request's line in the access log (info), when it is on.
  void log_access(const Request& request, const AccessEntry& entry, std::string_view client) const;
  // The same line for what has no HTTP request of its own (a WebSocket message: "WS").
  void log_access(std::string_view method, std::string_view path, const AccessEntry& entry,
                  std::string_view client) const;
  bool access_logged() const;
  // A connection coroutine ended on an exception: that connection alone is gone.
  void on_session_exception(std::exception_ptr error);
  // At most one warning a second in the log; the rest are counted and said with the next.
  void warn(const std::string& message);
};

}  // namespace troupe::net
