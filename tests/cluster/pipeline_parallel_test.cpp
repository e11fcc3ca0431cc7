// Pipeline parallelism across node processes on loopback (issue 34): a replica whose layers
// are cut into two stages, a worker on each of two nodes, the hidden states passed between
// the nodes' processes; it answers llama.cpp's greedy outputs (stories260K), and
// architecture references (gemma2: windows and softcaps by layer; qwen2: biases, a tied
// head) what one process serving them whole answers; two such replicas on four nodes
// (DP 2 x PP 2) both serve llama.cpp's outputs; and stages that are tensor-parallel groups
// (PP 2 x TP 2), each stage's two ranks on one node, serve them too.
#include "cluster/cluster_support.hpp"

#include <set>

using namespace troupe;
using namespace troupe::test::cluster;

namespace {

// Threads per worker that fill a node: it then holds one stage, and the pipeline spans
// nodes.
std::string all_cores() {
  return std::to_string(std::max(1U, std::thread::hardware_concurrency()));
}

std::string get_body(Cluster& cluster) {
  return cluster.get("/v1/cluster").body;
}

std::string text_of(const Reply& r) {
  return json_of(r.body)["choices"].array[0]["text"].string;
}

// A pipelined replica's workers in /v1/cluster: stage i on the i-th node of its label, the
// stages' layers one after the other from 0 to `num_layers`, no tensor-parallel rank.
void check_stages(const test::Json& replica, std::size_t num_stages, int num_layers) {
  const auto& workers = replica["workers"].array;
  REQUIRE(workers.size() == num_stages);
  std::string label;
  int next_layer = 0;
  for (std::size_t i = 0; i < workers.size(); ++i) {
    INFO("stage " << i);
    CHECK(workers[i]["stage"].number == static_cast<double>(i));
    CHECK(workers[i]["rank"].kind == test::Json::Kind::null);
    const std::vector<int> layers = workers[i]["layers"].ints();
    REQUIRE(layers.size() == 2u);
    CHECK(layers[0] == next_layer);
    CHECK(layers[1] > layers[0]);
    next_layer = layers[1];
    label += (i > 0 ? "," : "") + workers[i]["node"].string;
  }
  CHECK(next_layer == num_layers);
  CHECK(label == replica["node"].string);
}

// The pipeline's replica is on both nodes, one stage each.
void check_spans_both_nodes(Cluster& cluster, int num_layers) {
  const test::Json state = cluster.cluster();
  REQUIRE(state["nodes"].array.size() == 2u);
  for (const auto& n : state["nodes"].array) {
    CHECK(n["ranks"].number == 1);
    CHECK(n["replica"].number == 0);
  }
  CHECK(state["replicas"].array.at(0)["node"].string == "n0,n1");
  check_stages(state["replicas"].array.at(0), 2, num_layers);
}

// stories260K's golden cases, each asked `rounds` times (greedy, 64 tokens): every answer
// is llama.cpp's text. How many cases there are.
std::size_t check_golden_texts(Cluster& cluster, int rounds = 1) {
  const auto cases =
      test::JsonParser(test::read_text(test::shared_file("golden/stories260K_greedy.json")))
          .parse();
  for (int round = 0; round < rounds; ++round) {
    for (const auto& c : cases.array) {
      INFO("prompt '" << c["prompt"].string << "', round " << round);
      const std::string body = R"({"prompt":)" + ids(c["prompt_ids"].ints()) +
                               R"(,"max_tokens":64,"temperature":0,"ignore_eos":true})";
      const Reply reply = cluster.post("/v1/completions", body);
      REQUIRE(reply.status == 200);
      CHECK(text_of(reply) == c["output_text"].string);
    }
  }
  return cases.array.size();
}

}  // namespace

TEST_CASE("stories260K in two pipeline stages on two nodes gives llama.cpp's greedy outputs",
          "[cluster][pp][shared]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  Cluster cluster(1, "round-robin", {"--pp", "2"}, 2, all_cores(), model);
  check_golden_texts(cluster);
  check_spans_both_nodes(cluster, 5);  // stories260K: 5 layers, [0, 3) and [3, 5)
}

TEST_CASE("gemma2 and qwen2 in two pipeline stages on two nodes answer what one process answers",
          "[cluster][pp][shared]") {
  // One process serving the whole model gives llama.cpp's greedy outputs for every prompt
  // of the reference (tests/golden/archs_test.cpp); the two stages must give its texts.
  const std::string arch = GENERATE(as<std::string>{}, "gemma2", "qwen2");
  INFO(arch);
  const std::string model = test::shared_file("models/archs/" + arch + ".gguf");
  const auto golden =
      test::JsonParser(test::read_text(test::shared_file("golden/archs/" + arch + ".json")))
          .parse();
  Cluster cluster(1, "round-robin", {"--pp", "2"}, 2, all_cores(), model);
  ChildProcess single({TROUPE_BINARY, "serve", "-m", model, "--port", "0", "--threads", "1",
                       "--kv-cache-gb", "0.02"});
  const auto port = single.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(port.has_value());
  for (const auto& p : golden["prompts"].array) {
    INFO("prompt " << p["name"].string);
    const std::string body = R"({"prompt":)" + ids(p["prompt_ids"].ints()) +
                             R"(,"max_tokens":32,"temperature":0,"ignore_eos":true})";
    const Reply alone =
        http(static_cast<std::uint16_t>(std::stoi(*port)), "POST", "/v1/completions", body);
    const Reply staged = cluster.post("/v1/completions", body);
    REQUIRE(alone.status == 200);
    REQUIRE(staged.status == 200);
    CHECK(text_of(staged) == text_of(alone));
  }
  check_spans_both_nodes(
      cluster, static_cast<int>(golden["manifest"]["metadata"][arch + ".block_count"].number));
}

TEST_CASE("DP 2 x PP 2 on four nodes: both replicas serve llama.cpp's greedy outputs",
          "[cluster][pp][shared]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  // One thread a worker: every node has the slots for both of a replica's stages, and
  // still holds one (a pipeline's stages take a node each).
  Cluster cluster(2, "round-robin", {"--pp", "2"}, 4, "1", model);
  // Each case twice: round-robin gives each replica every prompt once.
  const std::size_t num_cases = check_golden_texts(cluster, 2);
  const test::Json state = cluster.cluster();
  INFO(get_body(cluster));
  // Four nodes, a stage each: two for each replica.
  REQUIRE(state["nodes"].array.size() == 4u);
  std::map<int, std::set<std::string>> nodes_of;
  for (const auto& n : state["nodes"].array) {
    CHECK(n["ranks"].number == 1);
    CHECK(n["slots"].number >= 1);
    nodes_of[static_cast<int>(n["replica"].number)].insert(n["name"].string);
  }
  REQUIRE(nodes_of.size() == 2u);
  CHECK(nodes_of[0].size() == 2u);
  CHECK(nodes_of[1].size() == 2u);
  // Both up, each on its two nodes, each routed half the requests.
  const auto& replicas = state["replicas"].array;
  REQUIRE(replicas.size() == 2u);
  for (const auto& r : replicas) {
    const int index = static_cast<int>(r["index"].number);
    INFO("replica " << index);
    CHECK(r["up"].boolean);
    const std::string label = r["node"].string;  // its stages' nodes in order: "n2,n0"
    const auto comma = label.find(',');
    REQUIRE(comma != std::string::npos);
    CHECK(std::set<std::string>{label.substr(0, comma), label.substr(comma + 1)} ==
          nodes_of[index]);
    CHECK(r["num_routed"].number == static_cast<double>(num_cases));
    check_stages(r, 2, 5);
  }
  // Each replica's steps timed their hop into stage 1, on the head's /metrics.
  CHECK(cluster.metric("troupe_pipeline_hop_seconds_count") > 0);
  CHECK(cluster.metric("troupe_pipeline_hop_seconds_sum") > 0);
}

TEST_CASE("PP 2 x TP 2 on two nodes: each stage's ranks on one node, llama.cpp's greedy outputs",
          "[cluster][pp][tp][shared]") {
  const std::string model = test::shared_file("models/stories260K.gguf");
  // One thread a worker: each 2-core node has the two slots of a stage's group.
  Cluster cluster(1, "round-robin", {"--pp", "2", "--tp", "2"}, 2, "1", model);
  check_golden_texts(cluster);
  const test::Json state = cluster.cluster();
  INFO(get_body(cluster));
  REQUIRE(state["nodes"].array.size() == 2u);
  for (const auto& n : state["nodes"].array) {
    CHECK(n["ranks"].number == 2);
    CHECK(n["replica"].number == 0);
  }
  // Stage 0's ranks 0 and 1 on one node, stage 1's on the other, the layers cut once.
  const auto& replica = state["replicas"].array.at(0);
  const auto& workers = replica["workers"].array;
  REQUIRE(workers.size() == 4u);
  for (std::size_t w = 0; w < workers.size(); ++w) {
    INFO("worker " << w);
    CHECK(workers[w]["stage"].number == static_cast<double>(w / 2));
    CHECK(workers[w]["rank"].number == static_cast<double>(w % 2));
    CHECK(workers[w]["node"].string == workers[w - w % 2]["node"].string);
  }
  CHECK(workers[0]["node"].string != workers[2]["node"].string);
  CHECK(workers[0]["layers"].ints() == workers[1]["layers"].ints());
  CHECK(workers[0]["layers"].ints()[1] == workers[2]["layers"].ints()[0]);
  CHECK(workers[2]["layers"].ints()[1] == 5);
  CHECK(replica["node"].string == workers[0]["node"].string + "," + workers[2]["node"].string);
  // One hop a step into stage 1 (its rank 0's).
  CHECK(cluster.metric("troupe_pipeline_hop_seconds_count") > 0);
}

TEST_CASE("PP 2 x TP 2 on nodes of one slot each is not placed, and the head says why",
          "[cluster][pp][tp]") {
  // Two threads a worker on 2-core nodes: one slot each, no node holds a stage of two
  // ranks (a stage is never spread), however many such nodes join.
  ChildProcess head({TROUPE_BINARY, "serve", "--port", "0", "--cluster-port", "0",
                     "--cluster-token", kToken, "--pp", "2", "--tp", "2", "--kv-cache-gb", "0.02",
                     "--cluster-wait", "10"});
  const auto port = head.wait_for(R"(cluster port 127\.0\.0\.1:(\d+))", 30s);
  REQUIRE(port.has_value());
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (const std::string name : {"n0", "n1"}) {
    nodes.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        TROUPE_BINARY, "node", "--join", "127.0.0.1:" + *port, "--cluster-token", kToken, "--name",
        name, "--threads", all_cores()}));
  }
  const auto code = head.wait_exit(60s);
  INFO(head.output());
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  CHECK_THAT(head.output(), Catch::Contains("each with 2 slots") &&
                                Catch::Contains("n0 (1 slot(s))") &&
                                Catch::Contains("n1 (1 slot(s))"));
  for (auto& node : nodes) node->kill(SIGTERM);
  for (auto& node : nodes) CHECK(node->wait_exit(30s).has_value());
}
