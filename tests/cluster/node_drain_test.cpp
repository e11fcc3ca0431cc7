// A node drained (issue 31): SIGTERM on a `troupe node`, or the head's
// POST /v1/cluster/nodes/{name}/drain. The head stops routing to the node's replica,
// moves its queued requests, lets the running ones finish (or moves them with their
// tokens at the node's --shutdown-timeout), then releases the node, which exits 0. Real
// processes on loopback, as the other cluster tests.
#include "cluster/cluster_support.hpp"

using namespace troupe;
using namespace troupe::test::cluster;

namespace {

constexpr int kTokens = 1500;

// Both replicas run one request and hold two in their queues.
void wait_for_queues(Cluster& cluster) {
  REQUIRE(cluster.eventually([&] {
    const test::Json state = cluster.cluster();
    for (const auto& r : state["replicas"].array) {
      if (r["num_running"].number != 1 || r["num_waiting"].number != 2) return false;
    }
    return true;
  }));
}

// After the drain: the node has left the cluster, the replica it held waits for a node,
// and a new request is served by the other node's replica.
void check_served_by_the_other(Cluster& cluster, const std::string& drained) {
  REQUIRE(cluster.eventually([&] { return cluster.cluster()["nodes"].array.size() == 1; }));
  const test::Json state = cluster.cluster();
  INFO(cluster.get("/v1/cluster").body);
  CHECK(state["nodes"].array[0]["name"].string != drained);
  int up = 0;
  for (const auto& r : state["replicas"].array) {
    if (!r["up"].boolean) {
      CHECK(r["state"].string == "waiting");
      continue;
    }
    ++up;
    CHECK(r["node"].string != drained);
  }
  CHECK(up == 1);
  const Reply health = cluster.get("/health");
  CHECK(health.status == 200);
  CHECK(json_of(health.body)["replicas_up"].number == 1);
  CHECK(cluster.post("/v1/completions", completion(prompt_for(9, 8), 4)).status == 200);
}

}  // namespace

TEST_CASE(
    "SIGTERM on a node drains it: its queued requests move, its running one finishes "
    "there, every stream has its undisturbed text, and the node exits 0",
    "[cluster][drain]") {
  Cluster cluster(2, "round-robin", {"--max-num-seqs", "1"});
  auto streams = open_streams(cluster.port(), 6, kTokens);
  wait_for_queues(cluster);
  cluster.nodes.at("n0")->kill(SIGTERM);
  CHECK(cluster.head->wait_for("node n0 drains \\(its SIGTERM\\)", 20s).has_value());
  // The running request finishes on n0 (its timeout is 30 s): nothing was cut.
  CHECK(cluster.head->wait_for("drained off node n0 \\(its requests finished", 60s).has_value());
  std::vector<std::string> texts;
  const auto ends = read_ends(streams, kTokens, &texts);
  CHECK(ends.errors == 0);
  CHECK(ends.complete == 6);
  CHECK(cluster.metric("troupe_request_migrations_total") == 0);
  const auto code = cluster.nodes.at("n0")->wait_exit(30s);
  INFO(cluster.nodes.at("n0")->output());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(cluster.nodes.at("n0")->output().find("the head released this node") != std::string::npos);
  check_served_by_the_other(cluster, "n0");
  check_undisturbed(cluster, texts, kTokens);
}

TEST_CASE(
    "POST /v1/cluster/nodes/{name}/drain drains a node: past its --shutdown-timeout the "
    "running request moves with its tokens, and every stream has its undisturbed text",
    "[cluster][drain]") {
  // A node's running requests have no time: they move after the step in flight.
  Cluster cluster(2, "round-robin", {"--max-num-seqs", "1"}, -1, "1", "",
                  {"--shutdown-timeout", "0"});
  // Bad names and methods first: nothing drains.
  CHECK(cluster.post("/v1/cluster/nodes/nope/drain", "").status == 404);
  CHECK(http(cluster.port(), "GET", "/v1/cluster/nodes/n0/drain").status == 405);
  const test::Json before = cluster.cluster();
  for (const auto& n : before["nodes"].array) CHECK_FALSE(n["draining"].boolean);

  auto streams = open_streams(cluster.port(), 6, kTokens);
  wait_for_queues(cluster);
  const Reply drain = cluster.post("/v1/cluster/nodes/n0/drain", "");
  INFO(drain.body);
  CHECK(drain.status == 202);
  CHECK(json_of(drain.body)["status"].string == "draining");
  CHECK(cluster.head->wait_for("node n0 drains \\(asked over HTTP\\)", 20s).has_value());
  CHECK(cluster.head->wait_for("drained off node n0 \\(its timeout passed; 1 request", 60s)
            .has_value());
  std::vector<std::string> texts;
  const auto ends = read_ends(streams, kTokens, &texts);
  CHECK(ends.errors == 0);
  CHECK(ends.complete == 6);
  CHECK(cluster.metric("troupe_request_migrations_total") == 1);
  const auto code = cluster.nodes.at("n0")->wait_exit(30s);
  INFO(cluster.nodes.at("n0")->output());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  check_served_by_the_other(cluster, "n0");
  check_undisturbed(cluster, texts, kTokens);
}

TEST_CASE("a drain already under way answers 409, and /v1/cluster shows the node draining",
          "[cluster][drain]") {
  // The node's replica holds a long request and its timeout is long: it drains a while.
  Cluster cluster(2, "round-robin", {"--max-num-seqs", "1"});
  auto streams = open_streams(cluster.port(), 6, kTokens);
  wait_for_queues(cluster);
  REQUIRE(cluster.post("/v1/cluster/nodes/n1/drain", "").status == 202);
  // Asked again at once (n1's running request has most of a second left): 409.
  const Reply again = cluster.post("/v1/cluster/nodes/n1/drain", "");
  const Reply state = cluster.get("/v1/cluster");
  INFO(again.body << "\n" << state.body);
  CHECK(again.status == 409);
  CHECK(again.body.find("draining already") != std::string::npos);
  const test::Json seen = json_of(state.body);
  bool node_draining = false;
  for (const auto& n : seen["nodes"].array) {
    if (n["name"].string == "n1") node_draining = n["draining"].boolean;
  }
  CHECK(node_draining);
  int replicas_draining = 0;
  for (const auto& r : seen["replicas"].array) {
    if (r["state"].string == "draining") {
      ++replicas_draining;
      CHECK_FALSE(r["up"].boolean);
      CHECK(r["node"].string == "n1");
    }
  }
  CHECK(replicas_draining == 1);
  // Routed elsewhere while it drains.
  CHECK(cluster.get("/health").status == 200);
  const auto ends = read_ends(streams, kTokens);
  CHECK(ends.errors == 0);
  CHECK(ends.complete == 6);
  const auto code = cluster.nodes.at("n1")->wait_exit(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE(
    "a rolling restart under load (each node drained, started again and rejoined, one "
    "after the other) fails no request, and every stream has its undisturbed text",
    "[cluster][drain]") {
  // One sequence at a time per replica and 24 streams: the load outlasts both restarts.
  // A node's running request has 2 s to finish, then moves with its tokens.
  Cluster cluster(2, "least-loaded", {"--max-num-seqs", "1", "--failover-timeout", "60"}, -1, "1",
                  "", {"--shutdown-timeout", "2"});
  constexpr int kStreams = 24;
  auto streams = open_streams(cluster.port(), kStreams, kTokens);
  REQUIRE(cluster.eventually([&] {
    const test::Json state = cluster.cluster();
    for (const auto& r : state["replicas"].array) {
      if (r["num_running"].number != 1) return false;
    }
    return true;
  }));
  for (const std::string name : {"n0", "n1"}) {
    INFO("restarting " << name);
    // Under load (the gauge follows each replica's steps: its first one may still run).
    CHECK(cluster.eventually([&] { return cluster.metric("troupe_num_requests_running") > 0; }));
    cluster.nodes.at(name)->kill(SIGTERM);
    const auto code = cluster.nodes.at(name)->wait_exit(60s);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    cluster.add_node(name);
    REQUIRE(cluster.eventually(
        [&] { return json_of(cluster.get("/health").body)["replicas_up"].number == 2; }, 60s));
  }
  std::vector<std::string> texts;
  const auto ends = read_ends(streams, kTokens, &texts);
  CHECK(ends.errors == 0);
  CHECK(ends.complete == kStreams);
  check_undisturbed(cluster, texts, kTokens);
}

TEST_CASE(
    "one replica drained off its node moves to a standby node with its requests, which "
    "resume there with their undisturbed text",
    "[cluster][drain]") {
  // One replica, two nodes (one a standby); no time to finish on the drained node.
  Cluster cluster(1, "round-robin", {"--max-num-seqs", "1"}, 2, "1", "",
                  {"--shutdown-timeout", "0"});
  auto streams = open_streams(cluster.port(), 3, kTokens);
  std::string drained;
  REQUIRE(cluster.eventually([&] {
    const test::Json state = cluster.cluster();
    const auto& r = state["replicas"].array.at(0);
    drained = r["node"].string;
    return r["num_running"].number == 1 && r["num_waiting"].number == 2;
  }));
  cluster.nodes.at(drained)->kill(SIGTERM);
  const auto code = cluster.nodes.at(drained)->wait_exit(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  std::vector<std::string> texts;
  const auto ends = read_ends(streams, kTokens, &texts);
  CHECK(ends.errors == 0);
  CHECK(ends.complete == 3);
  const test::Json state = cluster.cluster();
  CHECK(state["replicas"].array.at(0)["node"].string != drained);
  CHECK(state["replicas"].array.at(0)["up"].boolean);
  check_undisturbed(cluster, texts, kTokens);
}

TEST_CASE(
    "one replica drained off its only node: what is left waits --failover-timeout for a "
    "node, then ends with an error event and [DONE], and a node that joins later serves",
    "[cluster][drain]") {
  // One replica on one node, no time to finish there, and 2 s for a node to take it.
  Cluster cluster(1, "round-robin", {"--max-num-seqs", "1", "--failover-timeout", "2"}, 1, "1", "",
                  {"--shutdown-timeout", "0"});
  auto streams = open_streams(cluster.port(), 3, kTokens);
  REQUIRE(cluster.eventually([&] {
    const test::Json state = cluster.cluster();
    const auto& r = state["replicas"].array.at(0);
    return r["num_running"].number == 1 && r["num_waiting"].number == 2;
  }));
  cluster.nodes.at("n0")->kill(SIGTERM);
  const auto code = cluster.nodes.at("n0")->wait_exit(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  // No node comes: each stream ends with the error event, then [DONE] (the running one
  // after the tokens it streamed; the queued ones before any).
  for (auto& stream : streams) {
    const std::string all = stream->read_until("data: [DONE]", 30s);
    INFO(all.substr(0, 400));
    CHECK_THAT(all, Catch::Contains("data: [DONE]"));
    const auto error = all.find(R"(data: {"error")");
    REQUIRE(error != std::string::npos);
    CHECK(error < all.find("data: [DONE]"));
    CHECK_THAT(all.substr(error), Catch::Contains("no node took it within 2 s"));
  }
  CHECK(cluster.head->wait_for("replica 0: 3 request\\(s\\) end: replica 0 drained off node n0", 5s)
            .has_value());
  CHECK(cluster.get("/health").status == 503);
  // The replica still waits for a node: one that joins serves again.
  cluster.add_node("n1");
  REQUIRE(cluster.eventually([&] { return cluster.get("/health").status == 200; }, 60s));
  CHECK(cluster.post("/v1/completions", completion(prompt_for(1, 8), 4)).status == 200);
}

TEST_CASE("a second SIGTERM on a draining node leaves at once, and its requests move",
          "[cluster][drain]") {
  Cluster cluster(2, "round-robin", {"--max-num-seqs", "1"});
  auto streams = open_streams(cluster.port(), 6, kTokens);
  wait_for_queues(cluster);
  cluster.nodes.at("n0")->kill(SIGTERM);
  REQUIRE(cluster.nodes.at("n0")->wait_for("draining: the head moves", 10s).has_value());
  cluster.nodes.at("n0")->kill(SIGTERM);
  const auto code = cluster.nodes.at("n0")->wait_exit(10s);
  INFO(cluster.nodes.at("n0")->output());
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(cluster.nodes.at("n0")->output().find("second signal: leaving at once") !=
        std::string::npos);
  std::vector<std::string> texts;
  const auto ends = read_ends(streams, kTokens, &texts);
  CHECK(ends.errors == 0);
  CHECK(ends.complete == 6);
  check_undisturbed(cluster, texts, kTokens);
}

TEST_CASE("POST /v1/cluster/nodes/{name}/drain needs the API key", "[cluster][drain]") {
  Cluster cluster(1, "round-robin", {"--api-key", "sk-drain"});
  auto post_drain = [&](const std::string& auth) {
    test::RawClient c(cluster.port());
    REQUIRE(c.connected());
    REQUIRE(c.send("POST /v1/cluster/nodes/n0/drain HTTP/1.1\r\nHost: x\r\n" + auth +
                   "Connection: close\r\nContent-Length: 0\r\n\r\n"));
    const std::string all = c.read_all(30s);
    REQUIRE(all.size() > 12);
    return std::stoi(all.substr(9, 3));
  };
  CHECK(post_drain("") == 401);
  CHECK(post_drain("Authorization: Bearer wrong\r\n") == 401);
  CHECK(cluster.nodes.at("n0")->wait_exit(500ms) == std::nullopt);  // still there
  CHECK(post_drain("Authorization: Bearer sk-drain\r\n") == 202);
  const auto code = cluster.nodes.at("n0")->wait_exit(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}
