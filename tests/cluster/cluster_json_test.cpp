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
      net::cluster_json({}, {replica(0, 0.0), replica(1, 0.25), replica(2, 1.0)});
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
  const test::Json parsed = test::JsonParser(net::cluster_json({}, {waiting})).parse();
  const auto& r = parsed["replicas"].array.at(0);
  CHECK_FALSE(r["up"].boolean);
  CHECK(r["state"].string == "waiting");
  CHECK(r["node"].string.empty());
}
