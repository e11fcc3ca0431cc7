// bench/cluster_sim: the real router and schedulers on simulated time. Small runs: a seed
// gives one result, every request ends and gives its blocks back, and routing by prefix
// finds more of the history cached than taking replicas in turn.
#include "bench/cluster_sim.hpp"

#include <algorithm>
#include <catch2/catch.hpp>

using namespace troupe;
using bench::ClusterSimOptions;

namespace {

ClusterSimOptions small_multi_turn() {
  ClusterSimOptions o;
  o.workload = bench::SimWorkload::multi_turn;
  o.num_replicas = 4;
  o.num_requests = 300;
  o.rate = 8.0;
  o.seed = 7;
  o.replica.num_blocks = 512;
  o.replica.max_num_seqs = 16;
  o.replica.max_num_batched_tokens = 512;
  o.replica.max_model_len = 2048;
  o.multi_turn.system_prompt_len = 64;
  o.multi_turn.mean_think_s = 2.0;
  return o;
}

bench::SimRunResult simulate(const ClusterSimOptions& o, RoutingPolicy policy) {
  auto result = bench::simulate_cluster(o, policy);
  REQUIRE(result);
  return std::move(*result);
}

}  // namespace

TEST_CASE("one seed gives one result", "[bench]") {
  const ClusterSimOptions o = small_multi_turn();
  const auto a = simulate(o, RoutingPolicy::prefix);
  const auto b = simulate(o, RoutingPolicy::prefix);
  CHECK(a.num_hit_tokens == b.num_hit_tokens);
  CHECK(a.num_queried_tokens == b.num_queried_tokens);
  CHECK(a.ttft_s.p50 == b.ttft_s.p50);
  CHECK(a.e2e_s.p99 == b.e2e_s.p99);
  CHECK(a.num_steps == b.num_steps);
  CHECK(a.requests_per_replica == b.requests_per_replica);
}

TEST_CASE("every request ends, every replica is used and gives its blocks back", "[bench]") {
  ClusterSimOptions o = small_multi_turn();
  bool tight = false;
  SECTION("multi-turn") {}
  SECTION("shared-prefix") {
    o.workload = bench::SimWorkload::shared_prefix;
    o.shared_prefix.prefix_len = 256;
  }
  SECTION("a small cache: preemptions and evictions") {
    o.replica.num_blocks = 160;
    o.rate = 40.0;
    tight = true;
  }
  for (auto policy :
       {RoutingPolicy::prefix, RoutingPolicy::least_loaded, RoutingPolicy::round_robin}) {
    // simulate_cluster fails if a scheduler's invariants are broken at the end.
    const auto r = simulate(o, policy);
    CHECK(r.num_finished == o.num_requests);
    CHECK(r.final_kv_usage == 0.0);
    CHECK(std::ranges::all_of(r.requests_per_replica, [](std::int32_t n) { return n > 0; }));
    CHECK(r.ttft_s.p50 > 0.0);
    CHECK(r.ttft_s.p50 <= r.e2e_s.p50);
    CHECK(r.load_imbalance >= 1.0);
    if (tight) CHECK(r.num_preemptions > 0);
  }
}

TEST_CASE("on multi-turn chats the prefix router finds more cached than round robin", "[bench]") {
  const ClusterSimOptions o = small_multi_turn();
  const auto prefix = simulate(o, RoutingPolicy::prefix);
  const auto round_robin = simulate(o, RoutingPolicy::round_robin);
  const auto single = bench::simulate_single_replica(o);
  REQUIRE(single);
  CHECK(single->num_finished == o.num_requests);
  CHECK(prefix.hit_rate() > round_robin.hit_rate() + 0.2);
  CHECK(prefix.hit_rate() > 0.8 * single->hit_rate());
  CHECK(prefix.num_prefix_routes > 0);
  CHECK(prefix.ttft_s.p50 < round_robin.ttft_s.p50);
}

TEST_CASE("a step model is read from three numbers or JSON", "[bench]") {
  auto text = bench::parse_step_time_model("0.01 0.002 0.0005 H200 profile\n");
  REQUIRE(text);
  CHECK(text->a == 0.01);
  CHECK(text->c == 0.0005);
  CHECK(text->name == "H200 profile");
  CHECK(text->seconds(100, 4) == Approx(0.01 + 0.2 + 0.002));
  auto json = bench::parse_step_time_model(R"({"a": 0.005, "b": 1e-5, "c": 2e-5, "name": "x"})");
  REQUIRE(json);
  CHECK(json->b == 1e-5);
  CHECK(json->name == "x");
  CHECK_FALSE(bench::parse_step_time_model("0.01 0.002"));
  CHECK_FALSE(bench::parse_step_time_model(R"({"a": 0.01, "b": 0.002})"));
  CHECK_FALSE(bench::parse_step_time_model("-1 0 0"));
}

TEST_CASE("options that make no workload are errors", "[bench]") {
  ClusterSimOptions o = small_multi_turn();
  SECTION("no replica") {
    o.num_replicas = 0;
  }
  SECTION("no rate") {
    o.rate = 0.0;
  }
  SECTION("a first turn longer than the context") {
    o.replica.max_model_len = 64;
  }
  CHECK_FALSE(bench::simulate_cluster(o, RoutingPolicy::prefix));
}
