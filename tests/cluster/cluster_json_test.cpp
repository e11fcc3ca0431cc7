// GET /v1/cluster's body: plain JSON numbers, and a down replica's state as it is.
#include <catch2/catch.hpp>

#include "net/cluster_json.hpp"
#include "support/mini_json.hpp"

using namespace troupe;

namespace {

ReplicaStats replica(std::int32_t index, double kv_usage) {
  ReplicaStats r;
  r.index = index;
  r.node = "n" + std::to_string(index);
  r.stats.kv_usage = kv_usage;
  r.stats.num_kv_blocks = 64;
  return r;
}

}  // namespace

TEST_CASE("the cluster's KV usage is written as a plain JSON number", "[cluster]") {
  const std::string body =
      net::cluster_json({}, {replica(0, 0.0), replica(1, 0.25), replica(2, 1.0)}, {3, 3, 3, 3});
  INFO(body);
  // Boost.JSON 1.81 writes every double with an exponent: 0E0, 2.5E-1, 1E0.
  CHECK(body.find(R"("kv_usage":0,)") != std::string::npos);
  CHECK(body.find(R"("kv_usage":0.25,)") != std::string::npos);
  CHECK(body.find(R"("kv_usage":1,)") != std::string::npos);
  CHECK(body.find("E0") == std::string::npos);
  CHECK(body.find("E-") == std::string::npos);
  const test::Json parsed = test::JsonParser(body).parse();
  REQUIRE(parsed["replicas"].array.size() == 3u);
  CHECK(parsed["replicas"].array[1]["kv_usage"].number == 0.25);
}

TEST_CASE("a replica waiting for a node shows no node and says it waits", "[cluster]") {
  ReplicaStats waiting = replica(0, 0.0);
  waiting.up = false;
  waiting.state = "waiting";
  waiting.node.clear();
  const test::Json parsed =
      test::JsonParser(net::cluster_json({}, {waiting}, {0, 1, 1, 1})).parse();
  const auto& r = parsed["replicas"].array.at(0);
  CHECK_FALSE(r["up"].boolean);
  CHECK(r["state"].string == "waiting");
  CHECK(r["node"].string.empty());
}

TEST_CASE("the replica count: up, there now and the range, with no cap as null",
          "[cluster][elastic]") {
  ReplicaCount count;
  count.up = 1;
  count.current = 2;
  count.min = 1;
  count.max = EngineConfig::kUnboundedReplicas;
  count.elastic = true;
  const test::Json cluster = test::JsonParser(net::cluster_json({}, {}, count)).parse();
  const auto& c = cluster["replica_count"];
  CHECK(c["up"].number == 1);
  CHECK(c["current"].number == 2);
  CHECK(c["min"].number == 1);
  CHECK(c["max"].kind == test::Json::Kind::null);
  CHECK(c["elastic"].boolean);
  const std::string health = net::health_json(count);
  CHECK(health ==
        R"({"status":"ok","replicas_up":1,"replicas":2,"replicas_min":1,"replicas_max":null})");
  count.max = 3;
  count.up = 0;
  CHECK(
      net::health_json(count) ==
      R"({"status":"unavailable","replicas_up":0,"replicas":2,"replicas_min":1,"replicas_max":3})");
}

TEST_CASE("a replica's workers: each one's node and layers, a stage's index, a rank's rank",
          "[cluster][pp]") {
  ReplicaStats staged = replica(0, 0.0);
  staged.node = "n0,n1";
  staged.workers = {{"n0", -1, 0, 0, 8}, {"n1", -1, 1, 8, 16}};
  ReplicaStats split = replica(1, 0.0);
  split.workers = {{"n2", 0, -1, 0, 16}, {"n2", 1, -1, 0, 16}};
  ReplicaStats whole = replica(2, 0.0);
  whole.node.clear();
  whole.workers = {{"", -1, -1, 0, 16}};
  ReplicaStats down = replica(3, 0.0);
  down.up = false;
  down.state = "waiting";
  const std::string body = net::cluster_json({}, {staged, split, whole, down}, {3, 4, 4, 4});
  INFO(body);
  const test::Json parsed = test::JsonParser(body).parse();
  const auto& replicas = parsed["replicas"].array;
  REQUIRE(replicas.size() == 4u);
  const auto& stages = replicas[0]["workers"].array;
  REQUIRE(stages.size() == 2u);
  CHECK(stages[1]["node"].string == "n1");
  CHECK(stages[1]["stage"].number == 1);
  CHECK(stages[1]["rank"].kind == test::Json::Kind::null);
  CHECK(stages[1]["layers"].ints() == std::vector<int>{8, 16});
  CHECK(stages[0]["layers"].ints() == std::vector<int>{0, 8});
  const auto& ranks = replicas[1]["workers"].array;
  REQUIRE(ranks.size() == 2u);
  CHECK(ranks[1]["rank"].number == 1);
  CHECK(ranks[1]["stage"].kind == test::Json::Kind::null);
  CHECK(ranks[1]["layers"].ints() == std::vector<int>{0, 16});
  const auto& alone = replicas[2]["workers"].array;
  REQUIRE(alone.size() == 1u);
  CHECK(alone[0]["node"].string.empty());
  CHECK(alone[0]["rank"].kind == test::Json::Kind::null);
  CHECK(alone[0]["stage"].kind == test::Json::Kind::null);
  // A replica with no worker loaded lists none.
  CHECK(replicas[3]["workers"].array.empty());
  CHECK(replicas[3]["workers"].kind == test::Json::Kind::array);
}
