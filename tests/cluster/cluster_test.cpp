// The cluster on loopback: a head (`troupe serve --cluster-port 0`) and node processes
// (`troupe node --join`), each started and ended by its test, on a small random model.
#include "cluster/cluster_support.hpp"

using namespace troupe;
using namespace troupe::test::cluster;

TEST_CASE("a head and two nodes give one process's greedy outputs, over both replicas",
          "[cluster]") {
  ChildProcess single({TROUPE_BINARY, "serve", "-m", cluster_model(), "--port", "0", "--threads",
                       "1", "--kv-cache-gb", "0.02"});
  const auto single_port = single.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  REQUIRE(single_port.has_value());
  Cluster cluster(2, "least-loaded");

  for (int i = 0; i < 6; ++i) {
    const std::string body = completion(prompt_for(i, 5 + i), 12);
    const Reply alone =
        http(static_cast<std::uint16_t>(std::stoi(*single_port)), "POST", "/v1/completions", body);
    const Reply spread = cluster.post("/v1/completions", body);
    REQUIRE(alone.status == 200);
    REQUIRE(spread.status == 200);
    CHECK(json_of(spread.body)["choices"].array[0]["text"].string ==
          json_of(alone.body)["choices"].array[0]["text"].string);
  }
  const test::Json state = cluster.cluster();
  REQUIRE(state["nodes"].array.size() == 2u);
  REQUIRE(state["replicas"].array.size() == 2u);
  for (const auto& r : state["replicas"].array) {
    CHECK(r["up"].boolean);
    CHECK(r["num_routed"].number >= 1);
    CHECK_FALSE(r["node"].string.empty());
  }
  const Reply health = cluster.get("/health");
  CHECK(health.status == 200);
  CHECK(json_of(health.body)["replicas_up"].number == 2);
}

TEST_CASE("with --head-replica the head runs replica 0 itself and a node the other", "[cluster]") {
  ChildProcess head({TROUPE_BINARY, "serve", "-m", cluster_model(), "--port", "0", "--threads", "1",
                     "--cluster-port", "0", "--cluster-token", kToken, "--dp", "2",
                     "--head-replica", "--router", "round-robin", "--kv-cache-gb", "0.02"});
  const auto port = head.wait_for(R"(cluster port 127\.0\.0\.1:(\d+); waiting for 1 node)", 30s);
  REQUIRE(port.has_value());
  ChildProcess node({TROUPE_BINARY, "node", "--join", "127.0.0.1:" + *port, "--cluster-token",
                     kToken, "--name", "only", "--threads", "1"});
  const auto http_port = head.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  INFO(head.output());
  REQUIRE(http_port.has_value());
  const auto p = static_cast<std::uint16_t>(std::stoi(*http_port));
  for (int i = 0; i < 4; ++i) {
    CHECK(http(p, "POST", "/v1/completions", completion(prompt_for(i, 8), 4)).status == 200);
  }
  const test::Json state = json_of(http(p, "GET", "/v1/cluster").body);
  REQUIRE(state["replicas"].array.size() == 2u);
  CHECK(state["replicas"].array[0]["node"].string.empty());  // in the head
  CHECK(state["replicas"].array[1]["node"].string == "only");
  for (const auto& r : state["replicas"].array) CHECK(r["num_routed"].number == 2);
  REQUIRE(state["nodes"].array.size() == 1u);
  CHECK(state["nodes"].array[0]["gpus"].array.empty());  // this machine has none
}

TEST_CASE("with the prefix router, a chat's next turn goes to the replica holding its history",
          "[cluster]") {
  Cluster cluster(2, "prefix");
  std::vector<std::vector<int>> first;
  for (int i = 0; i < 4; ++i) {
    first.push_back(prompt_for(i, 40));
    REQUIRE(cluster.post("/v1/completions", completion(first.back(), 4)).status == 200);
  }
  const test::Json before = cluster.cluster();
  for (const auto& r : before["replicas"].array) CHECK(r["num_routed"].number >= 1);
  for (const auto& p : first) {
    auto next = p;
    for (int t : {7, 8, 9, 10}) next.push_back(t);
    const Reply turn = cluster.post("/v1/completions", completion(next, 4));
    REQUIRE(turn.status == 200);
    // The first turn's 40 prompt tokens hold 2 full blocks of 16.
    CHECK(json_of(turn.body)["usage"]["prompt_tokens_details"]["cached_tokens"].number == 32);
  }
  double prefix_routed = 0;
  const test::Json after = cluster.cluster();
  for (const auto& r : after["replicas"].array) {
    prefix_routed += r["num_prefix_routed"].number;
  }
  CHECK(prefix_routed == 4);
}

TEST_CASE(
    "a node killed under load: every stream completes with its undisturbed text, and a "
    "node that joins serves again",
    "[cluster]") {
  // One sequence at a time per replica, so that some requests wait in each queue.
  Cluster cluster(2, "round-robin", {"--max-num-seqs", "1"});
  const double idle_actors = cluster.settled_metric("troupe_live_actors");
  REQUIRE(idle_actors > 0);
  auto streams = open_streams(cluster.port(), 6, 1500);
  // Both replicas run one request and hold two in their queues: replica 0's node goes
  // at once (each request runs for most of a second, so the snapshot still holds).
  std::string lost_node;
  REQUIRE(cluster.eventually([&] {
    const test::Json state = cluster.cluster();
    for (const auto& r : state["replicas"].array) {
      if (r["num_running"].number != 1 || r["num_waiting"].number != 2) return false;
      if (r["index"].number == 0) lost_node = r["node"].string;
    }
    return true;
  }));
  cluster.nodes.at(lost_node)->kill(SIGKILL);

  // Every stream completes, no error event: replica 0 held three; the one running when its
  // node went moves to replica 1 with the tokens it streamed and continues there (a
  // migration), those queued behind it (two, unless the kill came late) move unseen. On a
  // slow machine the kill may land a moment later: hence the bounds.
  std::vector<std::string> texts;
  const auto ends = read_ends(streams, 1500, &texts);
  const double resubmitted = cluster.metric("troupe_resubmitted_requests_total");
  const double migrated = cluster.metric("troupe_request_migrations_total");
  CHECK(ends.errors == 0);
  CHECK(ends.complete == 6);
  CHECK(resubmitted >= 1);
  CHECK(migrated <= 1);  // 1 (checked), unless the kill landed between two requests
  CHECK(resubmitted + migrated <= 3);
  // Each text is what an undisturbed run gives (replica 1 alone now).
  for (int i = 0; i < 6; ++i) {
    INFO("stream " << i);
    const Reply alone = cluster.post("/v1/completions", completion(prompt_for(i, 8), 1500));
    REQUIRE(alone.status == 200);
    CHECK(texts.at(i) == json_of(alone.body)["choices"].array[0]["text"].string);
  }
  // The head holds nothing more than before.
  INFO("running " << cluster.metric("troupe_num_requests_running") << ", KV "
                  << cluster.metric("troupe_kv_cache_usage_ratio") << ", actors "
                  << cluster.metric("troupe_live_actors") << " (idle: " << idle_actors << ")");
  CHECK(cluster.eventually([&] {
    return cluster.metric("troupe_num_requests_running") == 0 &&
           cluster.metric("troupe_kv_cache_usage_ratio") == 0 &&
           cluster.metric("troupe_live_actors") == idle_actors;
  }));
  const Reply half = cluster.get("/health");
  CHECK(half.status == 200);
  CHECK(json_of(half.body)["replicas_up"].number == 1);

  // No replica left: 503, at once.
  for (auto& [name, node] : cluster.nodes) node->kill(SIGKILL);
  REQUIRE(cluster.eventually([&] { return cluster.get("/health").status == 503; }));
  CHECK(cluster.post("/v1/completions", completion(prompt_for(1, 8), 4)).status == 503);
  // /v1/cluster says what they are: waiting for a node, on none (not the node they lost),
  // their KV usage a plain number.
  const Reply down = cluster.get("/v1/cluster");
  INFO(down.body);
  const test::Json down_state = json_of(down.body);
  for (const auto& r : down_state["replicas"].array) {
    CHECK_FALSE(r["up"].boolean);
    CHECK(r["state"].string == "waiting");
    CHECK(r["node"].string.empty());
  }
  CHECK(down.body.find(R"("kv_usage":0,)") != std::string::npos);

  // Nodes join again: both replicas are placed and serve.
  cluster.add_node("back-1");
  cluster.add_node("back-2");
  REQUIRE(cluster.eventually(
      [&] {
        return cluster.get("/health").status == 200 &&
               json_of(cluster.get("/health").body)["replicas_up"].number == 2;
      },
      60s));
  for (int i = 0; i < 2; ++i) {
    CHECK(cluster.post("/v1/completions", completion(prompt_for(i, 8), 4)).status == 200);
  }
  const test::Json back = cluster.cluster();
  for (const auto& r : back["replicas"].array) {
    CHECK(r["up"].boolean);
    CHECK(r["node"].string.rfind("back-", 0) == 0);
  }
}

TEST_CASE(
    "every node killed mid-stream: the streams wait for a node to join, then complete "
    "with their undisturbed text",
    "[cluster][failover]") {
  Cluster cluster(2, "round-robin", {"--max-num-seqs", "1", "--failover-timeout", "120"});
  auto streams = open_streams(cluster.port(), 4, 1500);
  REQUIRE(cluster.eventually([&] {
    const test::Json state = cluster.cluster();
    for (const auto& r : state["replicas"].array) {
      if (r["num_running"].number != 1 || r["num_waiting"].number != 1) return false;
    }
    return true;
  }));
  for (auto& [name, node] : cluster.nodes) node->kill(SIGKILL);
  REQUIRE(cluster.eventually([&] { return cluster.get("/health").status == 503; }));
  // No replica is up: the moved requests wait (--failover-timeout) until one is again.
  cluster.add_node("back");
  std::vector<std::string> texts;
  const auto ends = read_ends(streams, 1500, &texts);
  CHECK(ends.errors == 0);
  CHECK(ends.complete == 4);
  CHECK(cluster.metric("troupe_request_migrations_total") >= 1);
  for (int i = 0; i < 4; ++i) {
    INFO("stream " << i);
    const Reply alone = cluster.post("/v1/completions", completion(prompt_for(i, 8), 1500));
    REQUIRE(alone.status == 200);
    CHECK(texts.at(i) == json_of(alone.body)["choices"].array[0]["text"].string);
  }
}

TEST_CASE("a node that stops answering is lost within seconds, and its requests go on",
          "[cluster]") {
  Cluster cluster(2, "round-robin", {"--max-num-seqs", "1"});
  auto streams = open_streams(cluster.port(), 4, 1500);
  REQUIRE(cluster.eventually([&] {
    const test::Json state = cluster.cluster();
    for (const auto& r : state["replicas"].array) {
      if (r["num_running"].number != 1 || r["num_waiting"].number != 1) return false;
    }
    return true;
  }));
  // Hung, its socket open: the heartbeats tell (3 s without one), well before the 60 s
  // step timeout would.
  cluster.nodes.at("n0")->kill(SIGSTOP);
  CHECK(cluster.head->wait_for("lost its worker on node n0", 20s).has_value());
  const auto ends = read_ends(streams, 1500);
  CHECK(ends.errors + ends.complete == 4);
  CHECK(ends.errors <= 1);
  CHECK(ends.complete >= 3);  // its queued one, at least, moved and finished
  cluster.nodes.at("n0")->kill(SIGKILL);
}

TEST_CASE("a node with another model file is refused, naming it and both fingerprints",
          "[cluster]") {
  const std::string other = test::write_small_model("cluster-other-model");
  ChildProcess head({TROUPE_BINARY, "serve", "-m", cluster_model(), "--port", "0", "--cluster-port",
                     "0", "--cluster-token", kToken, "--kv-cache-gb", "0.02"});
  const auto port = head.wait_for(R"(cluster port 127\.0\.0\.1:(\d+))", 30s);
  REQUIRE(port.has_value());
  ChildProcess node({TROUPE_BINARY, "node", "--join", "127.0.0.1:" + *port, "--cluster-token",
                     kToken, "--name", "stale", "-m", other});
  const auto refused = head.wait_for(
      "replica 0 cannot load on node stale: .* is not the engine's model file \\(fingerprint "
      "[0-9a-f-]+, expected [0-9a-f-]+\\)",
      60s);
  INFO(head.output());
  CHECK(refused.has_value());
  // The head then stops with an error, within a bound: a head that hangs fails the test
  // (and is killed).
  const auto code = head.wait_exit(30s);
  if (!code) head.kill(SIGKILL);
  REQUIRE(code.has_value());
  CHECK(*code != 0);
}

TEST_CASE("a replica placed again skips a node with another model file", "[cluster]") {
  Cluster cluster(1, "prefix");
  cluster.nodes.at("n0")->kill(SIGKILL);
  REQUIRE(cluster.eventually([&] { return cluster.get("/health").status == 503; }, 60s));
  ChildProcess stale({TROUPE_BINARY, "node", "--join",
                      "127.0.0.1:" + std::to_string(cluster.cluster_port), "--cluster-token",
                      kToken, "--name", "stale", "-m",
                      test::write_small_model("cluster-stale-model")});
  CHECK(cluster.head->wait_for("no replica is placed on node stale again: .*fingerprint", 60s)
            .has_value());
  CHECK(cluster.get("/health").status == 503);
  cluster.add_node("good");
  CHECK(cluster.head->wait_for("replica 0 is up again on node good", 60s).has_value());
  CHECK(cluster.post("/v1/completions", completion(prompt_for(1, 8), 4)).status == 200);
  const test::Json state = cluster.cluster();
  for (const auto& n : state["nodes"].array) {
    if (n["name"].string != "stale") continue;
    CHECK(n["replica"].number == -1);
    CHECK(n["unfit"].string.find("fingerprint") != std::string::npos);
  }
}

TEST_CASE("a node with the wrong token is refused, and the head says so", "[cluster]") {
  Cluster cluster(1, "prefix");
  auto& rogue = cluster.add_node("rogue", "not-the-token");
  const auto code = rogue.wait_exit(20s);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(rogue.output().find("refused rogue: wrong cluster token") != std::string::npos);
  CHECK(cluster.head->wait_for("refused node 'rogue'.*wrong cluster token", 5s).has_value());
  CHECK(cluster.cluster()["nodes"].array.size() == 1u);
}

namespace {

// A CA, and a certificate with its key signed by it, made with the openssl tool in `dir`.
bool make_certificates(const std::string& dir) {
  const std::string q = " >/dev/null 2>&1";
  auto run = [&](const std::string& command) { return std::system((command + q).c_str()) == 0; };
  auto ca = [&](const std::string& name) {
    return run("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=" + name + " -keyout " +
               dir + "/" + name + ".key -out " + dir + "/" + name + ".pem");
  };
  auto cert = [&](const std::string& name, const std::string& by) {
    return run("openssl req -newkey rsa:2048 -nodes -subj /CN=" + name + " -keyout " + dir + "/" +
               name + ".key -out " + dir + "/" + name + ".csr") &&
           run("openssl x509 -req -days 2 -in " + dir + "/" + name + ".csr -CA " + dir + "/" + by +
               ".pem -CAkey " + dir + "/" + by + ".key -CAcreateserial -out " + dir + "/" + name +
               ".pem");
  };
  return run("mkdir -p " + dir) && ca("ca") && ca("other") && cert("head", "ca") &&
         cert("node", "ca") && cert("rogue", "other");
}

std::vector<std::string> tls_args(const std::string& dir, const std::string& who,
                                  const std::string& ca = "ca") {
  return {"--cluster-tls-cert",     dir + "/" + who + ".pem", "--cluster-tls-key",
          dir + "/" + who + ".key", "--cluster-tls-ca",       dir + "/" + ca + ".pem"};
}

}  // namespace

TEST_CASE("with mutual TLS, only a node with a certificate from the cluster's CA joins",
          "[cluster]") {
  if (std::system("openssl version >/dev/null 2>&1") != 0) {
    test::skip_test("the openssl tool is absent (scripts/setup.sh installs it)");
  }
  const std::string dir = test::temp_path("cluster-tls");
  REQUIRE(make_certificates(dir));
  std::vector<std::string> head_argv{
      TROUPE_BINARY, "serve",           "-m",   cluster_model(), "--port", "0", "--cluster-port",
      "0",           "--cluster-token", kToken, "--kv-cache-gb", "0.02"};
  // A short handshake deadline: the joined node must outlive it.
  head_argv.insert(head_argv.end(), {"--cluster-handshake-timeout", "2"});
  for (auto& a : tls_args(dir, "head")) head_argv.push_back(a);
  ChildProcess head(head_argv);
  const auto port = head.wait_for(R"(cluster port 127\.0\.0\.1:(\d+))", 30s);
  REQUIRE(port.has_value());
  auto node_argv = [&](const std::string& name, std::vector<std::string> tls) {
    std::vector<std::string> argv{TROUPE_BINARY,     "node", "--join", "127.0.0.1:" + *port,
                                  "--cluster-token", kToken, "--name", name,
                                  "--threads",       "1"};
    argv.insert(argv.end(), tls.begin(), tls.end());
    return argv;
  };
  // No certificate, or one from another authority: the handshake fails, it never joins.
  ChildProcess plain(node_argv("plain", {}));
  ChildProcess rogue(node_argv("rogue", tls_args(dir, "rogue")));
  CHECK(plain.wait_for("disconnect_during_handshake", 20s).has_value());
  CHECK(rogue.wait_for("disconnect_during_handshake", 20s).has_value());
  // The head says so too, with OpenSSL's reason: the plain one speaks no TLS at all, the
  // rogue's certificate cannot be verified.
  CHECK(head.wait_for("a cluster connection from 127\\.0\\.0\\.1:\\d+ failed its TLS handshake "
                      "\\(.+\\)",
                      20s)
            .has_value());
  CHECK(head.wait_for("a cluster connection from 127\\.0\\.0\\.1:\\d+ failed its TLS handshake "
                      "\\(certificate verify failed\\)",
                      20s)
            .has_value());
  CHECK(head.output().find("joined") == std::string::npos);
  ChildProcess good(node_argv("good", tls_args(dir, "node")));
  const auto http_port = head.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  INFO(head.output());
  REQUIRE(http_port.has_value());
  const auto serving = static_cast<std::uint16_t>(std::stoi(*http_port));
  const Reply r = http(serving, "POST", "/v1/completions", completion(prompt_for(1, 8), 4));
  CHECK(r.status == 200);
  // A stranger's failed handshake must not cut the joined node off. (CAF's OpenSSL module
  // left the failure in OpenSSL's error queue, and the next read of the good link that
  // would block was taken for an error: tls_error_queue.cpp.)
  const std::string stranger =
      "echo | timeout 5 openssl s_client -connect 127.0.0.1:" + *port + " >/dev/null 2>&1";
  for (int i = 0; i < 5; ++i) {
    CHECK(std::system(stranger.c_str()) != -1);
    CHECK(http(serving, "POST", "/v1/completions", completion(prompt_for(i, 8), 4)).status == 200);
  }
  // Nor does the handshake's deadline: its link is a node's, past its handshake.
  CHECK_FALSE(head.wait_for("node good was lost", 3s).has_value());
  CHECK(head.output().find("node good joined") != std::string::npos);
  CHECK(head.output().find("node plain") == std::string::npos);
  CHECK(head.output().find("node rogue") == std::string::npos);
}

TEST_CASE("a cluster port off loopback needs a token", "[cluster]") {
  ChildProcess head({TROUPE_BINARY, "serve", "-m", cluster_model(), "--port", "0", "--cluster-port",
                     "0", "--cluster-host", "0.0.0.0"});
  const auto code = head.wait_exit(30s);
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  CHECK(head.output().find("without a cluster token") != std::string::npos);
}
