#include "engine/router.hpp"

namespace troupe::engine {

std::optional<RoutingPolicy> parse_routing_policy(std::string_view name) {
  if (name == "prefix") return RoutingPolicy::prefix;
  if (name == "least-loaded") return RoutingPolicy::least_loaded;
  if (name == "round-robin") return RoutingPolicy::round_robin;
  return std::nullopt;
}

std::string_view to_string(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::prefix:
      return "prefix";
    case RoutingPolicy::least_loaded:
      return "least-loaded";
    case RoutingPolicy::round_robin:
      return "round-robin";
  }
  return "prefix";
}

namespace {

// Replicas in the order ties are broken: starting after the one picked last.
template <class Visit>
void in_turn(std::span<const ReplicaView> replicas, std::size_t last, Visit visit) {
  const std::size_t n = replicas.size();
  for (std::size_t k = 1; k <= n; ++k) {
    const std::size_t i = (last + k) % n;
    if (replicas[i].up) visit(i);
  }
}

}  // namespace

std::optional<std::size_t> Router::least_loaded(std::span<const ReplicaView> replicas) const {
  std::optional<std::size_t> best;
  in_turn(replicas, last_, [&](std::size_t i) {
    if (!best) {
      best = i;
      return;
    }
    const ReplicaView& r = replicas[i];
    const ReplicaView& b = replicas[*best];
    if (r.load() < b.load() || (r.load() == b.load() && r.kv_usage < b.kv_usage)) best = i;
  });
  return best;
}

std::optional<std::size_t> Router::next_up(std::span<const ReplicaView> replicas) const {
  std::optional<std::size_t> first;
  in_turn(replicas, last_, [&](std::size_t i) {
    if (!first) first = i;
  });
  return first;
}

std::optional<Route> Router::pick(std::span<const ReplicaView> replicas) {
  if (replicas.empty()) return std::nullopt;
  std::optional<Route> route;
  if (config_.policy == RoutingPolicy::round_robin) {
    if (auto i = next_up(replicas)) route = Route{*i, RouteReason::round_robin};
  } else {
    const std::optional<std::size_t> lightest = least_loaded(replicas);
    if (!lightest) return std::nullopt;
    route = Route{*lightest, RouteReason::least_loaded};
    if (config_.policy == RoutingPolicy::prefix) {
      // The longest cached prefix; among equals, the lighter load.
      std::optional<std::size_t> holder;
      in_turn(replicas, last_, [&](std::size_t i) {
        const ReplicaView& r = replicas[i];
        if (r.cached_prefix_tokens <= 0) return;
        if (!holder || r.cached_prefix_tokens > replicas[*holder].cached_prefix_tokens ||
            (r.cached_prefix_tokens == replicas[*holder].cached_prefix_tokens &&
             r.load() < replicas[*holder].load())) {
          holder = i;
        }
      });
      if (holder) {
        const ReplicaView& h = replicas[*holder];
        const bool too_busy = h.load() - replicas[*lightest].load() > config_.max_load_gap;
        const bool too_full = h.kv_usage > config_.max_kv_usage &&
                              replicas[*lightest].kv_usage <= config_.max_kv_usage;
        if (!too_busy && !too_full) route = Route{*holder, RouteReason::prefix_hit};
      }
    }
  }
  if (route) last_ = route->replica;
  return route;
}

}  // namespace troupe::engine
