#include <catch2/catch.hpp>
#include <vector>

#include "engine/router.hpp"

using namespace troupe;
using namespace troupe::engine;

namespace {

ReplicaView replica(std::int32_t running, std::int32_t cached = 0, double kv = 0.0) {
  ReplicaView r;
  r.num_running = running;
  r.cached_prefix_tokens = cached;
  r.kv_usage = kv;
  return r;
}

std::vector<std::size_t> picks(Router& router, const std::vector<ReplicaView>& replicas, int n) {
  std::vector<std::size_t> out;
  for (int i = 0; i < n; ++i) out.push_back(router.pick(replicas)->replica);
  return out;
}

}  // namespace

TEST_CASE("policies are named as on the command line", "[engine][router]") {
  for (auto p : {RoutingPolicy::prefix, RoutingPolicy::least_loaded, RoutingPolicy::round_robin}) {
    CHECK(parse_routing_policy(to_string(p)) == p);
  }
  CHECK(to_string(RoutingPolicy::least_loaded) == "least-loaded");
  CHECK_FALSE(parse_routing_policy("random").has_value());
}

TEST_CASE("round robin takes the replicas in turn and skips those down", "[engine][router]") {
  Router router({RoutingPolicy::round_robin});
  std::vector<ReplicaView> r(3);
  CHECK(picks(router, r, 4) == std::vector<std::size_t>{0, 1, 2, 0});
  r[2].up = false;
  CHECK(picks(router, r, 3) == std::vector<std::size_t>{1, 0, 1});
  CHECK(router.pick(r)->reason == RouteReason::round_robin);
}

TEST_CASE("least loaded counts waiting and running, then KV usage, and ties take turns",
          "[engine][router]") {
  Router router({RoutingPolicy::least_loaded});
  std::vector<ReplicaView> r{replica(3), replica(1), replica(2)};
  CHECK(router.pick(r)->replica == 1);
  r[1].num_waiting = 5;  // 6 now
  CHECK(router.pick(r)->replica == 2);
  // Equal loads: the lower KV usage.
  std::vector<ReplicaView> same{replica(2, 0, 0.5), replica(2, 0, 0.2)};
  CHECK(router.pick(same)->replica == 1);
  // Wholly equal: in turn.
  Router fresh({RoutingPolicy::least_loaded});
  std::vector<ReplicaView> idle(3);
  CHECK(picks(fresh, idle, 4) == std::vector<std::size_t>{0, 1, 2, 0});
}

TEST_CASE("prefix routing follows the longest cached prefix within the load bound",
          "[engine][router]") {
  RouterConfig config;
  config.policy = RoutingPolicy::prefix;
  config.max_load_gap = 4;
  Router router(config);
  // Replica 2 holds the longest prefix and is busier, within the gap: it takes it.
  std::vector<ReplicaView> r{replica(0, 16), replica(1), replica(4, 64)};
  auto route = router.pick(r);
  CHECK(route->replica == 2);
  CHECK(route->reason == RouteReason::prefix_hit);
  // Past the gap (5 more than the lightest): the least loaded takes it.
  r[2].num_waiting = 1;
  route = router.pick(r);
  CHECK(route->replica == 0);
  CHECK(route->reason == RouteReason::least_loaded);
  // Equal prefixes: the lighter of the two.
  std::vector<ReplicaView> tie{replica(3, 32), replica(1, 32), replica(0)};
  CHECK(router.pick(tie)->replica == 1);
  // No prefix anywhere: least loaded, in turn among equals.
  std::vector<ReplicaView> none(2);
  CHECK(router.pick(none)->reason == RouteReason::least_loaded);
}

TEST_CASE("prefix routing passes over a replica whose KV cache is full", "[engine][router]") {
  Router router({RoutingPolicy::prefix});
  std::vector<ReplicaView> r{replica(2, 64, 0.99), replica(2, 0, 0.30)};
  CHECK(router.pick(r)->replica == 1);
  r[1].kv_usage = 0.97;  // both full: the cache is worth more
  CHECK(router.pick(r)->replica == 0);
}

TEST_CASE("no replica up: no route", "[engine][router]") {
  for (auto p : {RoutingPolicy::prefix, RoutingPolicy::least_loaded, RoutingPolicy::round_robin}) {
    Router router({p});
    std::vector<ReplicaView> r(2);
    r[0].up = r[1].up = false;
    CHECK_FALSE(router.pick(r).has_value());
    CHECK_FALSE(router.pick({}).has_value());
  }
  // A down replica's cache is not followed.
  Router router({RoutingPolicy::prefix});
  std::vector<ReplicaView> r{replica(0, 64), replica(3)};
  r[0].up = false;
  CHECK(router.pick(r)->replica == 1);
}
