// The router: which data-parallel replica takes a request. Pure logic over what the
// head knows of each replica when the request arrives: whether it is up, its load,
// and how much of this prompt its prefix cache holds. The head holds every replica's
// scheduler, so that last number is exact, not an estimate.
//
//   prefix        the replica with the longest cached prefix of the prompt, unless
//                 its load exceeds the least-loaded one's by more than
//                 `max_load_gap` (or none holds any): then the least loaded.
//   least_loaded  fewest waiting + running requests; then the lower KV usage.
//   round_robin   the next replica that is up.
//
// Ties go to the replica after the one picked last, so equal replicas take turns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "troupe/config.hpp"

namespace troupe::engine {

std::optional<RoutingPolicy> parse_routing_policy(std::string_view name);
std::string_view to_string(RoutingPolicy policy);

// One replica as the router sees it for one request.
struct ReplicaView {
  bool up = true;
  std::int32_t num_waiting = 0;
  std::int32_t num_running = 0;
  double kv_usage = 0.0;                  // fraction of its KV blocks held
  std::int32_t cached_prefix_tokens = 0;  // of this request's prompt

  std::int32_t load() const { return num_waiting + num_running; }
};

struct RouterConfig {
  RoutingPolicy policy = RoutingPolicy::prefix;
  // prefix: how many more requests (waiting + running) than the least-loaded replica
  // the cache-holding one may carry before the request goes to the least loaded. Small:
  // with a larger gap, new chat sessions (whose longest cached prefix is the system
  // prompt) pile onto the few replicas that served first and evict each other's
  // histories (`troupe bench cluster-sim`, BENCHMARKS.md: 2 met both targets at 512 and
  // 2730 blocks per replica; 16 missed both at 512).
  std::int32_t max_load_gap = 2;
  // prefix: a replica whose KV usage is above this is passed over for the least loaded
  // (taking the request would preempt).
  double max_kv_usage = 0.95;
};

enum class RouteReason { prefix_hit, least_loaded, round_robin };

struct Route {
  std::size_t replica = 0;
  RouteReason reason = RouteReason::least_loaded;
};

class Router {
 public:
  explicit Router(RouterConfig config = {}) : config_(config) {}

  const RouterConfig& config() const { return config_; }

  // The replica for a request; nothing when no replica is up.
  std::optional<Route> pick(std::span<const ReplicaView> replicas);

 private:
  std::optional<std::size_t> least_loaded(std::span<const ReplicaView> replicas) const;
  std::optional<std::size_t> next_up(std::span<const ReplicaView> replicas) const;

  RouterConfig config_;
  std::size_t last_ = static_cast<std::size_t>(-1);  // the replica picked last
};

}  // namespace troupe::engine
