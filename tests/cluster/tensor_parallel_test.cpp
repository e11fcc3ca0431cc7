// Tensor parallelism across node processes on loopback: a replica whose model is split
// over ranks on one node or on several, alone or with data parallelism, and a group
// that loses a rank under load.
#include "cluster/cluster_support.hpp"

using namespace troupe;
using namespace troupe::test::cluster;

namespace {

// Threads per worker that fill a node: it then holds one rank, and a group spans nodes.
std::string all_cores() {
  return std::to_string(std::max(1U, std::thread::hardware_concurrency()));
}

std::string text_of(const Reply& r) {
  return json_of(r.body)["choices"].array[0]["text"].string;
}

// The nodes /v1/cluster lists, by name.
std::map<std::string, test::Json> nodes_of(Cluster& cluster) {
  std::map<std::string, test::Json> nodes;
  const test::Json state = cluster.cluster();
  for (const auto& n : state["nodes"].array) nodes[n["name"].string] = n;
  return nodes;
}

// One process serving `model` whole (one worker, one thread) answers `count` greedy
// completions as `cluster` does; prompt i has `length(i)` tokens.
template <class Length>
void check_same_outputs_as_one_process(Cluster& cluster, const std::string& model, int count,
                                       Length length, int max_tokens) {
  ChildProcess single({TROUPE_BINARY, "serve", "-m", model, "--port", "0", "--threads", "1",
                       "--kv-cache-gb", "0.02"});
  const auto port = single.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(port.has_value());
  for (int i = 0; i < count; ++i) {
    const std::string body = completion(prompt_for(i, length(i)), max_tokens);
    const Reply alone =
        http(static_cast<std::uint16_t>(std::stoi(*port)), "POST", "/v1/completions", body);
    const Reply split = cluster.post("/v1/completions", body);
    REQUIRE(alone.status == 200);
    REQUIRE(split.status == 200);
    CHECK(text_of(split) == text_of(alone));
  }
}

}  // namespace

TEST_CASE("stories260K split over two nodes gives llama.cpp's greedy outputs",
          "[cluster][tp][shared]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  const auto cases =
      test::JsonParser(test::read_text(test::shared_file("golden/stories260K_greedy.json")))
          .parse();
  // A worker per node: the group spans both.
  Cluster cluster(1, "round-robin", {"--tp", "2"}, 2, all_cores(), model);
  for (const auto& c : cases.array) {
    INFO("prompt '" << c["prompt"].string << "'");
    const std::string body = R"({"prompt":)" + ids(c["prompt_ids"].ints()) +
                             R"(,"max_tokens":64,"temperature":0,"ignore_eos":true})";
    const Reply reply = cluster.post("/v1/completions", body);
    REQUIRE(reply.status == 200);
    CHECK(text_of(reply) == c["output_text"].string);
  }
  const auto nodes = nodes_of(cluster);
  REQUIRE(nodes.size() == 2u);
  for (const auto& [name, n] : nodes) {
    CHECK(n["ranks"].number == 1);
    CHECK(n["replica"].number == 0);
  }
  const test::Json replica = cluster.cluster()["replicas"].array.at(0);
  CHECK(replica["node"].string == "n0,n1");
  // Its workers: rank 0 on n0, rank 1 on n1, each with every layer (stories260K: 5), no
  // pipeline stage.
  const auto& workers = replica["workers"].array;
  REQUIRE(workers.size() == 2u);
  for (std::size_t r = 0; r < workers.size(); ++r) {
    CHECK(workers[r]["node"].string == "n" + std::to_string(r));
    CHECK(workers[r]["rank"].number == static_cast<double>(r));
    CHECK(workers[r]["stage"].kind == test::Json::Kind::null);
    CHECK(workers[r]["layers"].ints() == std::vector<int>{0, 5});
  }
}

TEST_CASE("two replicas of two ranks each: each group on one node, one process's outputs",
          "[cluster][tp]") {
  // One thread per worker: a node holds both ranks of a group (vLLM's rule: a group stays
  // on one node when it fits).
  Cluster cluster(2, "round-robin", {"--tp", "2"});
  check_same_outputs_as_one_process(
      cluster, cluster_model(), 4, [](int i) { return 5 + i; }, 12);
  const auto nodes = nodes_of(cluster);
  REQUIRE(nodes.size() == 2u);
  CHECK(nodes.at("n0")["ranks"].number == 2);
  CHECK(nodes.at("n1")["ranks"].number == 2);
  CHECK(nodes.at("n0")["replica"].number != nodes.at("n1")["replica"].number);
  const test::Json state = cluster.cluster();
  for (const auto& r : state["replicas"].array) {
    CHECK(r["up"].boolean);
    CHECK(r["num_routed"].number >= 1);
  }
}

TEST_CASE(
    "a 12-head, 4-KV-head model split over four ranks on two nodes gives one process's "
    "outputs",
    "[cluster][tp]") {
  // The ~110M shape's heads (12, and 4 KV heads: one per rank at four), smaller.
  const std::string model = test::write_small_model("cluster-gqa", [](model::RandomModelSpec& s) {
    s.dim = 384;
    s.num_layers = 4;
    s.num_heads = 12;
    s.num_kv_heads = 4;
    s.ffn_dim = 1024;
    s.context_length = 512;
  });
  // Half the cores per worker: each node holds two ranks, so the group spans both.
  const std::string half = std::to_string(std::max(1U, std::thread::hardware_concurrency() / 2));
  Cluster cluster(1, "round-robin", {"--tp", "4"}, 2, half, model);
  check_same_outputs_as_one_process(
      cluster, model, 4, [](int i) { return 4 + 3 * i; }, 10);
  const auto nodes = nodes_of(cluster);
  CHECK(nodes.at("n0")["ranks"].number == 2);
  CHECK(nodes.at("n1")["ranks"].number == 2);
}

TEST_CASE("a rank killed under load ends its group's requests, and the group comes back",
          "[cluster][tp]") {
  // One rank per node; two sequences run at a time, a third waits.
  Cluster cluster(1, "round-robin", {"--tp", "2", "--max-num-seqs", "2"}, 2, all_cores());
  const double idle_actors = cluster.settled_metric("troupe_live_actors");
  auto streams = open_streams(cluster.port(), 3, 1500);
  REQUIRE(cluster.eventually([&] {
    const test::Json r = cluster.cluster()["replicas"].array.at(0);
    return r["num_running"].number == 2 && r["num_waiting"].number == 1;
  }));
  cluster.nodes.at("n1")->kill(SIGKILL);
  CHECK(cluster.head->wait_for("replica 0 lost its worker on node n0,n1", 20s).has_value());

  // Every stream ends, none hangs: with no other replica, even the waiting one ends with
  // an error (it streamed nothing, and no replica could take it).
  int errors = 0;
  for (auto& c : streams) {
    const std::string all = c->read_all(60s);
    CHECK(c->closed_by_peer());
    const bool failed = all.find(R"("finish_reason":"error")") != std::string::npos ||
                        all.find(R"("error")") != std::string::npos;
    if (failed) ++errors;
    CHECK((failed || all.find(R"("finish_reason":"length")") != std::string::npos));
  }
  CHECK(errors >= 2);
  REQUIRE(cluster.eventually([&] { return cluster.get("/health").status == 503; }));
  // Nothing is held for the lost group.
  CHECK(cluster.eventually([&] {
    return cluster.metric("troupe_num_requests_running") == 0 &&
           cluster.metric("troupe_kv_cache_usage_ratio") == 0;
  }));

  // A node joins: the group is placed again, over the surviving node (whose rank ended
  // with its group) and the new one, and serves.
  cluster.add_node("back");
  REQUIRE(cluster.eventually([&] { return cluster.get("/health").status == 200; }, 60s));
  const Reply after = cluster.post("/v1/completions", completion(prompt_for(1, 8), 4));
  CHECK(after.status == 200);
  const auto nodes = nodes_of(cluster);
  CHECK(nodes.at("n0")["ranks"].number == 1);
  CHECK(nodes.at("back")["ranks"].number == 1);
  CHECK(cluster.eventually([&] {
    return cluster.metric("troupe_live_actors") == idle_actors &&
           cluster.metric("troupe_num_requests_running") == 0;
  }));
}

TEST_CASE(
    "a rank killed under load with a second replica: the group's streams move there and "
    "complete with their undisturbed text",
    "[cluster][tp]") {
  // Replica 0 is a group of two threads in the head; replica 1 a group over two nodes, a
  // rank on each. Two sequences at a time each.
  constexpr int kTokens = 80;
  Cluster cluster(2, "round-robin",
                  {"--tp", "2", "--head-replica", "--threads", "1", "--max-num-seqs", "2",
                   "--failover-timeout", "60"},
                  2, all_cores(), test::shared_file("models/stories260K.gguf"));
  CHECK(cluster.cluster()["replicas"].array.at(1)["node"].string == "n0,n1");
  auto streams = open_streams(cluster.port(), 4, kTokens);
  // Both replicas run two (round-robin), and every stream has sent a token before the
  // rank goes: replica 1's two move with their tokens.
  REQUIRE(cluster.eventually([&] {
    const test::Json state = cluster.cluster();
    for (const auto& r : state["replicas"].array) {
      if (r["num_running"].number != 2) return false;
    }
    return true;
  }));
  for (auto& c : streams) {
    REQUIRE_THAT(c->read_until(R"("finish_reason":null)", 20s),
                 Catch::Contains(R"("finish_reason":null)"));
  }
  cluster.nodes.at("n1")->kill(SIGKILL);
  CHECK(cluster.head->wait_for("replica 1 lost its worker on node n0,n1", 20s).has_value());
  std::vector<std::string> texts;
  const auto ends = read_ends(streams, kTokens, &texts);
  CHECK(ends.errors == 0);
  CHECK(ends.complete == 4);
  CHECK(cluster.metric("troupe_request_migrations_total") == 2);
  // The head's group serves alone (replica 1 waits for a node with room for a rank).
  CHECK(json_of(cluster.get("/health").body)["replicas_up"].number == 1);
  check_undisturbed(cluster, texts, kTokens);
}

TEST_CASE("a rank that stops answering ends its group within seconds, and no stream hangs",
          "[cluster][tp]") {
  Cluster cluster(1, "round-robin", {"--tp", "2", "--collective-timeout", "2"}, 2, all_cores());
  auto streams = open_streams(cluster.port(), 2, 1500);
  REQUIRE(cluster.eventually(
      [&] { return cluster.cluster()["replicas"].array.at(0)["num_running"].number == 2; }));
  // Stopped, its sockets open: the other rank's all-reduce times out (2 s), or the
  // heartbeats find the node silent (3 s), whichever comes first.
  cluster.nodes.at("n1")->kill(SIGSTOP);
  CHECK(cluster.head->wait_for("replica 0 lost its worker on node n0,n1", 20s).has_value());
  for (auto& c : streams) {
    const std::string all = c->read_all(60s);
    CHECK(c->closed_by_peer());
    CHECK(all.find(R"("finish_reason":"error")") != std::string::npos);
  }
  CHECK(cluster.eventually([&] { return cluster.get("/health").status == 503; }));
  cluster.nodes.at("n1")->kill(SIGKILL);
}

namespace {

// The workers a node process holds, as it last said ("a worker ended here (1 held)"): what
// is alive there, whatever the head believes it placed.
int workers_held(const ChildProcess& node) {
  const std::string out = node.output();
  const std::regex held(R"(\((\d+) held\))");
  int last = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), held); it != std::sregex_iterator();
       ++it) {
    last = std::stoi((*it)[1].str());
  }
  return last;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("a group lost under load is placed once, and no node keeps a worker out of use",
          "[cluster][tp]") {
  // One thread per rank: a node holds the whole group, and a spare node takes it over.
  Cluster cluster(1, "round-robin", {"--tp", "2", "--max-num-seqs", "2"}, 1, "1");
  std::string holder = "n0";
  for (int loss = 1; loss <= 3; ++loss) {
    INFO("loss " << loss);
    const std::string spare = "spare-" + std::to_string(loss);
    cluster.add_node(spare);
    REQUIRE(cluster.head->wait_for("node " + spare + " joined", 30s).has_value());
    // A step in flight when the node goes: the group answers it failed, and then ends.
    auto streams = open_streams(cluster.port(), 2, 1500);
    REQUIRE(cluster.eventually(
        [&] { return cluster.cluster()["replicas"].array.at(0)["num_running"].number == 2; }));
    cluster.nodes.at(holder)->kill(SIGKILL);
    for (auto& c : streams) c->read_all(60s);
    REQUIRE(cluster.eventually(
        [&] {
          const test::Json r = cluster.cluster()["replicas"].array.at(0);
          return r["up"].boolean && r["node"].string == spare;
        },
        60s));
    holder = spare;
    // The spare node holds the group's two ranks, and nothing else lives on any node.
    INFO(cluster.head->output());
    CHECK(cluster.eventually([&] {
      for (const auto& [name, node] : cluster.nodes) {
        if (node->wait_exit(0ms)) continue;  // killed
        if (workers_held(*node) != (name == holder ? 2 : 0)) return false;
      }
      return true;
    }));
    for (const auto& [name, node] : cluster.nodes) {
      if (!node->wait_exit(0ms)) CHECK(workers_held(*node) == (name == holder ? 2 : 0));
    }
    // One placement at start, and one per loss.
    CHECK(count_of(cluster.head->output(), "replica 0 placed on node") == 1 + loss);
  }
  CHECK(cluster.post("/v1/completions", completion(prompt_for(1, 8), 4)).status == 200);
}
