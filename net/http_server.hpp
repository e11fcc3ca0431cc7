// The HTTP front: Boost.Beast on C++20 coroutines, one coroutine per
// connection. OpenAI-compatible routes over the Engine API, SSE streaming,
// OpenAI error objects, timeouts and limits.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/chat_template.hpp"
#include "troupe/engine.hpp"

namespace troupe::monitoring {
class Metrics;
class StepEvents;
}  // namespace troupe::monitoring

namespace troupe::net {

// Which cross-origin requests browsers may make (net/cors.hpp); vLLM's defaults: all.
struct CorsConfig {
  std::vector<std::string> allowed_origins{"*"};
  std::vector<std::string> allowed_methods{"*"};
  std::vector<std::string> allowed_headers{"*"};
  bool allow_credentials = false;
};

// HTTPS (vLLM's --ssl-keyfile, --ssl-certfile, --ssl-ca-certs, --ssl-cert-reqs): on when a
// key or a certificate is given (net/tls_stream.hpp).
struct TlsConfig {
  std::string keyfile;   // PEM private key; empty: the certfile holds it (as Python reads it)
  std::string certfile;  // PEM certificate chain, the server's own first
  std::string ca_certs;  // PEM CAs that client certificates are checked against
  // Python's ssl.CERT_NONE (0: no client certificate asked), CERT_OPTIONAL (1: asked, and
  // checked when one is given) or CERT_REQUIRED (2: a client without one is refused).
  int cert_reqs = 0;
  // A connection that has not finished its handshake by then is closed.
  std::chrono::seconds handshake_timeout{10};
  bool enabled() const { return !keyfile.empty() || !certfile.empty(); }
};

// The TLS configuration's files read and checked as HttpServer::start reads them: an
// error naming the flag and the file, for `troupe serve` to fail on before the model loads.
Result<void> check_tls_config(const TlsConfig& config);

struct ServerConfig {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8000;  // 0: any free port (see HttpServer::port)
  // A socket already bound and listening (bind_listener), which the server takes over
  // instead of binding host:port itself at start(); -1: none.
  int listen_fd = -1;
  std::string served_model_name = "troupe";
  // More names the model answers to (vLLM's --served-model-name a b): accepted in requests
  // and listed by /v1/models; answers name served_model_name.
  std::vector<std::string> other_model_names;
  // LoRA adapters served beside the model (--lora-modules): their API names, the i-th for
  // the engine's adapter slot i + 1 (EngineConfig::lora_adapters[i]), and their paths
  // (/v1/models gives each as its root).
  struct LoraModule {
    std::string name;
    std::string path;
  };
  std::vector<LoraModule> lora_modules;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter load and unload adapters while
  // serving (--enable-runtime-lora-updating, or VLLM_ALLOW_RUNTIME_LORA_UPDATING); off,
  // they answer a 400 that says how to turn them on. A loaded adapter's file is checked as
  // a --lora-modules one is: its rank at most max_lora_rank.
  bool runtime_lora_updating = false;
  std::int32_t max_lora_rank = 16;
  std::string api_key;  // non-empty: /v1 routes need "Authorization: Bearer <key>"
  // Jinja chat template text overriding the model's own (empty: the model's), and what
  // to call it in the log ("--chat-template file x.jinja").
  std::string chat_template;
  std::string chat_template_origin;
  // How the model writes tool calls: hermes, llama3_json or mistral; empty: from the chat
  // template (net/tool_calls.hpp).
  std::string tool_call_parser;
  // vLLM's --reasoning-parser (deepseek_r1, qwen3, gpt_oss, ...): a chat's thinking is
  // given apart as reasoning_content. Empty: none.
  std::string reasoning_parser;
  // The most top alternatives a token's logprobs may ask for (vLLM's --max-logprobs); the
  // sampler's own bound is 20.
  int max_logprobs = 20;
  std::size_t max_body_bytes = std::size_t{4} << 20;     // 413 past it
  std::size_t max_header_bytes = std::size_t{16} << 10;  // 431 past it (trailers too)
  std::chrono::seconds read_timeout{30};                 // for a whole request (headers and body)
  std::chrono::seconds write_timeout{60};                // for each write to the client
  // Open connections; past it a new one gets 503. The process's descriptor limit must
  // hold it (start() raises the soft limit to the hard one, and refuses otherwise).
  int max_connections = 1024;
  // Generation requests (HTTP and WebSocket) admitted at once, running or queued in the
  // engine; past it a request gets 429. A slot is freed when its request ends in the engine.
  int max_concurrent_requests = 1024;
  // Generate messages one WebSocket may have running at once; past it an error frame with
  // 429: one client's socket cannot take every slot above.
  int max_requests_per_socket = 256;
  // Output a connection may have waiting for its client, in bytes: a client that falls
  // further behind has its requests cancelled and its connection closed (WebSocket 1008).
  std::size_t max_buffered_output_bytes = std::size_t{1} << 20;
  // How long a drain (SIGTERM, POST /v1/admin/drain) lets running generations go on
  // before it cuts them (`troupe serve --shutdown-timeout`; the admin call's answer says it).
  std::chrono::seconds shutdown_timeout{30};
  int num_threads = 1;  // I/O threads (each connection keeps to one strand)
  // Threads that parse and tokenize request bodies, off the I/O threads.
  int num_tokenizer_threads = 2;
  CorsConfig cors;
  TlsConfig tls;
  // One line per request in the log (route, status, tokens, times, client); the log's
  // level must be info or lower for it to show.
  bool access_log = true;
  // The built-in page at GET / (net/web_assets.hpp); off: 404 there. With a directory
  // set, its files are served instead of the embedded ones (for developing the page).
  bool web_page = true;
  std::string web_dir;
  // Served at GET /metrics (with the HTTP counts added); 404 there when null.
  std::shared_ptr<monitoring::Metrics> metrics;
  // The engine's steps, streamed at GET /v1/engine/events (the live page); 404 there when
  // null. The engine must publish into the same hub (EngineConfig::step_events).
  std::shared_ptr<monitoring::StepEvents> step_events;
};

// Binds and listens on host:port (0: any free port) as HttpServer::start does, before any
// server exists: `troupe serve` holds its port from before the model loads, so that a
// port in use is found at once, not after the load. The socket's descriptor, for
// ServerConfig::listen_fd (its owner closes it when no server takes it).
Result<int> bind_listener(const std::string& host, std::uint16_t port);

class HttpServer {
 public:
  HttpServer(Engine& engine, ServerConfig config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Raises the process's soft descriptor limit to its hard one; an error when that
  // cannot hold config.max_connections (start() checks it too: call it first to fail
  // before a model loads).
  static Result<void> prepare_descriptor_limit(const ServerConfig& config);
  // Binds and starts serving on background threads.
  Result<void> start();
  // Closes the listener and every connection; waits for the threads.
  void stop();
  // Starts the drain (once; POST /v1/admin/drain does the same): new generation requests
  // get 503 with Retry-After (HTTP) or an error frame (the socket), /health answers 503
  // {"status":"draining"}, idle connections close and every answer closes its connection.
  // Running generations go on. `why` is logged.
  void drain(const std::string& why);
  bool draining() const;
  // Generations running, or still being written to their clients.
  int num_generations() const;
  // Draining, nothing is left to wait for: no generation, and every WebSocket connection
  // has closed with 1001 (going away) after its last request.
  bool drained() const;
  // Ends every generation still running: a stream with its choices' finish reason
  // "error", an error event and [DONE]; a socket's with its error and done frames; a
  // JSON answer as a 503 error. The drain's last step at its timeout.
  void cut_generations();
  std::uint16_t port() const;
  int num_connections() const;
  // What chat requests render through (the startup log names it).
  const text::ChatTemplate& chat_template() const;
  // The tool-call format chat outputs are read in ("hermes", ...).
  std::string_view tool_call_parser() const;
  // Generation requests admitted and not yet ended in the engine.
  int num_requests_in_flight() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::net
