// What the head lets in at its cluster port before a node has joined: a connection is
// "pending" from its accept until a node joins over it (the registry took its token), and
// it has a deadline for that; pending connections are capped; and the port takes no
// connection that would leave fewer free descriptors than the rest of the process (the
// HTTP server's connections) is promised. So the public API stays up whatever reaches
// the cluster port: idle, half-open, slow or refused peers included.
//
// The gate is bookkeeping and policy only; cluster_port.cpp puts it between CAF's
// multiplexer and its BASP broker. Thread-safe: the multiplexer's thread accepts and
// closes, the registry says who joined, and a thread of the gate's own ends what is late.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace troupe::actors::cluster {

struct GateLimits {
  // From the accept to the node's join (TLS, BASP's handshake, the join with its token).
  std::chrono::milliseconds handshake_timeout{10000};
  int max_pending = 32;  // connections in their handshake at once; past it, closed at once
  // Descriptors the port leaves free for the rest of the process (0: none kept).
  int reserved_descriptors = 0;
};

class ClusterGate {
 public:
  explicit ClusterGate(GateLimits limits);
  ~ClusterGate();
  ClusterGate(const ClusterGate&) = delete;
  ClusterGate& operator=(const ClusterGate&) = delete;

  const GateLimits& limits() const { return limits_; }

  // Whether a connection just accepted from `peer` ("address:port") may start its
  // handshake: nullopt when it may; else why not (said in the log, rate-limited), and
  // the caller closes it.
  std::optional<std::string> refusal(const std::string& peer);

  // The connection on `fd` starts its handshake; the number names it from now on. `fd`
  // must stay open until closed() is called for it: the gate shuts it down when late.
  std::uint64_t opened(int fd, const std::string& peer);
  // Its TLS handshake failed, and why (said when it closes).
  void tls_failed(std::uint64_t connection, const std::string& why);
  // It is closed (before its descriptor is): one that no node joined over is logged.
  void closed(std::uint64_t connection);
  // A node joined over the connection from this peer: it is no longer pending.
  void joined(const std::string& address, std::uint16_t port);

  // Connections in their handshake now.
  int num_pending() const;
  // How many more descriptors the port may take beside the reserve (-1: no limit).
  int room() const;

  // A connection could not even be accepted (the process is out of descriptors): one is
  // freed for a moment, the connection accepted from `listener` and closed at once, so
  // that it does not wait in the backlog and wake the acceptor again and again.
  void shed(int listener);

 private:
  struct Connection {
    int fd = -1;
    std::string peer;
    std::chrono::steady_clock::time_point deadline;
    bool joined = false;
    bool timed_out = false;
    std::string tls_failure;
  };

  void expire_loop();
  void log(const std::string& line);  // rate-limited
  int num_pending_locked() const;

  const GateLimits limits_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::uint64_t, Connection> connections_;
  std::uint64_t next_ = 1;
  bool stopping_ = false;
  int spare_fd_ = -1;  // held for shed()
  // The log's rate: at most kLogBurst lines a window, the rest counted and said after.
  std::chrono::steady_clock::time_point log_window_{};
  int num_logged_ = 0;
  int num_unlogged_ = 0;
  std::thread expirer_;
};

// Descriptors this process may still open (-1: no limit), and its limit.
int free_descriptors();

}  // namespace troupe::actors::cluster
