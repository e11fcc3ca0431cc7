// A node: `troupe node --join HOST:PORT`. It joins the head's registry with its
// resources and the cluster token, offers the worker actor for remote spawn, and holds
// no model until the head spawns a worker on it. Its first SIGTERM drains it (the head
// moves its requests off, then releases it); a second leaves at once. When the head goes, the node
// ends the workers it held and joins again with backoff, until it is stopped.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace troupe::actors::cluster {

struct NodeSettings {
  std::string head_host = "127.0.0.1";
  std::uint16_t head_port = 0;
  std::string token;
  std::string name;              // empty: host name and pid
  std::int32_t num_threads = 0;  // per worker (0: all cores)
  std::string device = "cpu";    // cpu or cuda
  std::int32_t num_gpus = -1;    // GPUs it announces (-1: every one it has)
  double kv_cache_gb = 0.0;      // 0: what the head asks for
  std::string model_path;        // empty: the head's path
  // Where other nodes' ranks of a tensor-parallel group reach this node's (empty: its
  // address on the route to the head).
  std::string collective_host;
  std::string tls_certificate;  // mutual TLS with the head: all three or none
  std::string tls_key;
  std::string tls_ca;
  // How long a drain (its first SIGTERM) lets the requests running here finish before
  // the head moves them, with their tokens, to another replica.
  std::int64_t shutdown_timeout_s = 30;
};

// Runs until the head refuses the node (1) or `signals` (SIGTERM and SIGINT seen) says
// so (0): the first, while the node has joined, asks the head to drain it, and the node
// exits once the head releases it (its replicas moved off); the second, or the first
// while it has not joined, leaves at once.
int run_node(const NodeSettings& settings, const std::atomic<int>& signals);

}  // namespace troupe::actors::cluster
