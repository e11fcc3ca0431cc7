// Elastic data parallelism (issue 31, item 3): a head started with --data-parallel-size
// 1:3 serves with one node; a node that joins under load gets a replica that takes
// requests, and a node that leaves (drained, or killed) takes its replica with it while
// every stream completes with its undisturbed text. The count follows in /v1/cluster,
// /health and the metrics. Real processes on loopback (stories260K, one thread per node).
#include <sys/wait.h>

#include <fstream>
#include <limits>

#include "cluster/cluster_support.hpp"

using namespace troupe;
using namespace troupe::test::cluster;

namespace {

constexpr int kTokens = 120;  // stories260K's context (128) holds the prompt and these

std::string stories() {
  return test::shared_file("models/stories260K.gguf");
}

// The replica of this index in /v1/cluster (a null Json when there is none).
test::Json replica_at(const test::Json& state, int index) {
  for (const auto& r : state["replicas"].array) {
    if (static_cast<int>(r["index"].number) == index) return r;
  }
  return {};
}

// The counts /v1/cluster and /health give: replicas there now, and up.
void check_count(Cluster& cluster, int replicas) {
  const test::Json state = cluster.cluster();
  INFO(cluster.get("/v1/cluster").body);
  const auto& count = state["replica_count"];
  CHECK(count["current"].number == replicas);
  CHECK(count["up"].number == replicas);
  CHECK(count["min"].number == 1);
  CHECK(count["max"].number == 3);
  CHECK(count["elastic"].boolean);
  CHECK(state["replicas"].array.size() == static_cast<std::size_t>(replicas));
  const Reply health = cluster.get("/health");
  INFO(health.body);
  CHECK(health.status == 200);
  const test::Json h = json_of(health.body);
  CHECK(h["replicas"].number == replicas);
  CHECK(h["replicas_up"].number == replicas);
  CHECK(h["replicas_min"].number == 1);
  CHECK(h["replicas_max"].number == 3);
  CHECK(cluster.metric("troupe_data_parallel_replicas") == replicas);
}

// `n` streams from prompt `first` on.
std::vector<std::unique_ptr<test::RawClient>> streams_from(Cluster& cluster, int first, int n) {
  std::vector<std::unique_ptr<test::RawClient>> streams;
  for (int i = first; i < first + n; ++i) {
    const std::string body = completion(prompt_for(i, 8), kTokens, /*stream=*/true);
    auto c = std::make_unique<test::RawClient>(cluster.port());
    REQUIRE(
        c->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                "Content-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\n\r\n" + body));
    streams.push_back(std::move(c));
  }
  return streams;
}

}  // namespace

TEST_CASE(
    "an elastic head grows a replica on a node that joins under load, which takes "
    "requests, and loses it with the node without failing a stream",
    "[cluster][elastic]") {
  // One sequence at a time per replica: the streams queue, and outlast the join.
  Cluster cluster(1, "least-loaded",
                  {"--dp", "1:3", "--max-num-seqs", "1", "--failover-timeout", "60"}, 1, "1",
                  stories(), {"--shutdown-timeout", "0"});
  check_count(cluster, 1);
  std::vector<std::unique_ptr<test::RawClient>> streams;
  const auto open = [&](int n) {
    for (auto& s : streams_from(cluster, static_cast<int>(streams.size()), n)) {
      streams.push_back(std::move(s));
    }
  };
  open(4);
  REQUIRE(cluster.eventually([&] { return cluster.metric("troupe_num_requests_running") == 1; }));

  // A node joins while streams run (two more every 50 ms, more than one replica runs in
  // that time: the load lasts however long the join takes): it gets replica 1.
  cluster.add_node("n1");
  REQUIRE(cluster.eventually([&] {
    open(2);
    return json_of(cluster.get("/health").body)["replicas_up"].number == 2;
  }));
  CHECK(cluster.metric("troupe_num_requests_running") >= 1);  // still under load
  CHECK(cluster.head->wait_for("replica 1 joined on node n1: 2 replica", 5s).has_value());
  check_count(cluster, 2);
  // New streams go to the new replica too (the least loaded), which runs them.
  open(8);
  REQUIRE(cluster.eventually([&] {
    const test::Json r = replica_at(cluster.cluster(), 1);
    return r.kind != test::Json::Kind::null && r["num_running"].number == 1 &&
           r["num_waiting"].number >= 1;
  }));
  {
    const test::Json state = cluster.cluster();
    INFO(cluster.get("/v1/cluster").body);
    CHECK(replica_at(state, 1)["node"].string == "n1");
    CHECK(replica_at(state, 1)["num_routed"].number >= 2);
    CHECK(replica_at(state, 0)["node"].string == "n0");
  }
  CHECK(cluster.metric("troupe_data_parallel_replicas_added_total") == 1);

  SECTION("drained over HTTP: its running request moves with its tokens") {
    REQUIRE(cluster.post("/v1/cluster/nodes/n1/drain", "").status == 202);
    const auto code = cluster.nodes.at("n1")->wait_exit(30s);
    INFO(cluster.nodes.at("n1")->output());
    REQUIRE(code.has_value());
    CHECK(*code == 0);
    CHECK(cluster.head->wait_for("replica 1 left: 1 replica", 10s).has_value());
  }
  SECTION("killed: its requests move as a lost node's do") {
    cluster.nodes.at("n1")->kill(SIGKILL);
    CHECK(cluster.head->wait_for("replica 1 left: 1 replica", 20s).has_value());
  }
  std::vector<std::string> texts;
  const auto ends = read_ends(streams, kTokens, &texts);
  CHECK(ends.errors == 0);
  CHECK(ends.complete == static_cast<int>(streams.size()));
  CHECK(cluster.metric("troupe_request_migrations_total") >= 1);
  REQUIRE(cluster.eventually([&] { return cluster.cluster()["nodes"].array.size() == 1; }));
  check_count(cluster, 1);
  CHECK(cluster.metric("troupe_data_parallel_replicas_removed_total") == 1);
  CHECK(replica_at(cluster.cluster(), 0)["node"].string == "n0");
  check_undisturbed(cluster, texts, kTokens);

  // A node that joins later gets a replica again (the one asked for since the count fell
  // below the maximum: index 2).
  cluster.add_node("n2");
  REQUIRE(cluster.eventually(
      [&] { return json_of(cluster.get("/health").body)["replicas_up"].number == 2; }));
  const test::Json grown = cluster.cluster();
  INFO(cluster.get("/v1/cluster").body);
  CHECK(replica_at(grown, 2)["node"].string == "n2");
  CHECK(cluster.post("/v1/completions", completion(prompt_for(0, 8), 4)).status == 200);
}

TEST_CASE("auto takes a replica on each node that joins, with no cap", "[cluster][elastic]") {
  Cluster cluster(1, "round-robin", {"--dp", "auto"}, 1, "1", stories());
  cluster.add_node("n1");
  cluster.add_node("n2");
  REQUIRE(cluster.eventually(
      [&] { return json_of(cluster.get("/health").body)["replicas_up"].number == 3; }));
  const test::Json state = cluster.cluster();
  INFO(cluster.get("/v1/cluster").body);
  CHECK(state["replica_count"]["current"].number == 3);
  CHECK(state["replica_count"]["max"].kind == test::Json::Kind::null);
  CHECK(json_of(cluster.get("/health").body)["replicas_max"].kind == test::Json::Kind::null);
  CHECK(cluster.metric("troupe_data_parallel_replicas") == 3);
  CHECK(cluster.metric("troupe_data_parallel_replicas_max") ==
        std::numeric_limits<double>::infinity());
  CHECK(cluster.metric("troupe_data_parallel_replicas_added_total") == 2);
  // The exposition with an unbounded maximum (+Inf) passes promtool's lint.
  if (std::system("command -v promtool > /dev/null 2>&1") == 0) {
    const std::string file = test::temp_path("elastic-metrics.txt");
    {
      std::ofstream out(file);
      out << cluster.metrics();
    }
    const int status =
        std::system(("promtool check metrics < " + file + " > " + file + ".out 2>&1").c_str());
    INFO(test::read_text(file + ".out"));
    CHECK(WEXITSTATUS(status) == 0);
  }
  // Each replica answers: round-robin sends one request to each.
  for (int i = 0; i < 3; ++i) {
    CHECK(cluster.post("/v1/completions", completion(prompt_for(i, 8), 8)).status == 200);
  }
  const test::Json served = cluster.cluster();
  for (const auto& r : served["replicas"].array) CHECK(r["num_routed"].number == 1);
}

TEST_CASE("below its minimum an elastic head goes on serving with the replicas it has",
          "[cluster][elastic]") {
  Cluster cluster(2, "round-robin", {"--dp", "2:3"}, 2, "1", stories());
  REQUIRE(cluster.post("/v1/cluster/nodes/n1/drain", "").status == 202);
  const auto code = cluster.nodes.at("n1")->wait_exit(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(cluster.head->wait_for("1 replica\\(s\\) \\(min 2, max 3\\); below the minimum", 10s)
            .has_value());
  const Reply health = cluster.get("/health");
  INFO(health.body);
  CHECK(health.status == 200);
  const test::Json h = json_of(health.body);
  CHECK(h["replicas"].number == 1);
  CHECK(h["replicas_up"].number == 1);
  CHECK(h["replicas_min"].number == 2);
  CHECK(cluster.post("/v1/completions", completion(prompt_for(0, 8), 8)).status == 200);
  // The next node to join brings it back to the minimum.
  cluster.add_node("n2");
  REQUIRE(cluster.eventually(
      [&] { return json_of(cluster.get("/health").body)["replicas_up"].number == 2; }));
}
