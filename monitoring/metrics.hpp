// The server's Prometheus metrics (prometheus-cpp's registry and text format;
// net/ serves them at GET /metrics). Actors and the HTTP front record into it;
// it knows nothing of either. Every method is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace troupe::monitoring {

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The Prometheus text exposition of every metric.
  std::string serialize() const;

  // --- one model iteration (the scheduler actor) ---
  void observe_iteration(double seconds, std::int64_t num_tokens);
  void set_queue(std::int64_t num_running, std::int64_t num_waiting, double kv_usage);
  void add_tokens(std::int64_t num_prompt, std::int64_t num_generated);
  void add_preemptions(std::int64_t n);
  void add_prefix_cache(std::int64_t queried_tokens, std::int64_t hit_tokens);
  void observe_queue_time(double seconds);

  // --- one request (its actor, when it ends) ---
  void observe_request(std::string_view finish_reason, double e2e_seconds, double ttft_seconds,
                       double tpot_seconds, bool has_tokens);
  void observe_inter_token(double seconds);
  // From the first scheduled step to the first token, and from there to the last.
  void observe_phases(double prefill_seconds, double decode_seconds);

  // --- the HTTP front ---
  void count_http(std::string_view route, int status);
  // Set when /metrics is scraped: open connections, generation requests admitted and
  // not yet ended in the engine, and actors alive in the engine's actor system.
  void set_server_state(std::int64_t num_connections, std::int64_t num_requests_in_flight,
                        std::int64_t num_live_actors);
  // A connection the server ended on its own: "exception" (a defect caught at the
  // connection's top frame), "slow_reader" (output past its bound), "bad_request".
  void count_connection_error(std::string_view reason);
  // accept() failed (descriptor limit, aborted handshake); the server retries.
  void count_accept_error();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::monitoring
