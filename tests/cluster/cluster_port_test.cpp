// The head's cluster port against what is not a node: idle and half-open connections by
// the hundred under a low descriptor limit, while the HTTP API answers and nodes join.
#include <regex>

#include "cluster/cluster_support.hpp"

using namespace troupe;
using namespace troupe::test::cluster;

namespace {

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("300 idle connections to the cluster port under a 256-descriptor limit leave HTTP up",
          "[cluster][integration]") {
  // Replica 0 in the head, replica 1 on a node; the process may hold 256 descriptors.
  const std::string serve = std::string(TROUPE_BINARY) + " serve -m " + cluster_model() +
                            " --port 0 --threads 1 --kv-cache-gb 0.02 --max-connections 64" +
                            " --cluster-port 0 --cluster-token " + kToken +
                            " --dp 2 --head-replica --router round-robin" +
                            " --cluster-handshake-timeout 3 --cluster-wait 30";
  ChildProcess head({"/bin/sh", "-c", "ulimit -n 256 && exec " + serve});
  const auto port = head.wait_for(R"(cluster port 127\.0\.0\.1:(\d+))", 30s);
  REQUIRE(port.has_value());
  const auto cluster_port = static_cast<std::uint16_t>(std::stoi(*port));
  ChildProcess node({TROUPE_BINARY, "node", "--join", "127.0.0.1:" + *port, "--cluster-token",
                     kToken, "--name", "n0", "--threads", "1"});
  const auto http_port = head.wait_for(R"(serving '.*' at http://127\.0\.0\.1:(\d+))", 60s);
  INFO(head.output());
  REQUIRE(http_port.has_value());
  const auto serving = static_cast<std::uint16_t>(std::stoi(*http_port));

  // One that sends half a BASP header and stalls, then 300 that never send a byte.
  std::vector<std::unique_ptr<test::RawClient>> idle;
  idle.push_back(std::make_unique<test::RawClient>(cluster_port));
  REQUIRE(idle.back()->send(std::string(10, '\0')));
  for (int i = 0; i < 300; ++i) {
    idle.push_back(std::make_unique<test::RawClient>(cluster_port));
    REQUIRE(idle.back()->connected());
  }
  // Meanwhile the API answers: a health check, and completions on both replicas.
  CHECK(http(serving, "GET", "/health", "", 20s).status == 200);
  for (int i = 0; i < 2; ++i) {
    CHECK(http(serving, "POST", "/v1/completions", completion(prompt_for(i, 8), 4), 20s).status ==
          200);
  }
  // Every one is closed by the head: at once past the cap, or at the handshake's deadline.
  int closed = 0;
  for (auto& c : idle) {
    c->read_all(30s);
    closed += c->closed_by_peer() ? 1 : 0;
  }
  CHECK(closed == 301);
  // Said in the log, but not 301 times.
  CHECK(head.wait_for("refused a cluster connection from 127\\.0\\.0\\.1:\\d+: 32 connections are "
                      "in their handshake already",
                      1s)
            .has_value());
  CHECK(head.wait_for("more cluster connections were refused or closed", 20s).has_value());
  CHECK(count_of(head.output(), "cluster connection") <= 25);

  // The node that joined before is still there (its link was no handshake to end), and
  // another joins now.
  ChildProcess late({TROUPE_BINARY, "node", "--join", "127.0.0.1:" + *port, "--cluster-token",
                     kToken, "--name", "late", "--threads", "1"});
  CHECK(head.wait_for("node late joined", 30s).has_value());
  for (int i = 0; i < 2; ++i) {
    CHECK(http(serving, "POST", "/v1/completions", completion(prompt_for(i, 8), 4)).status == 200);
  }
  const test::Json state = json_of(http(serving, "GET", "/v1/cluster").body);
  CHECK(state["nodes"].array.size() == 2u);
  CHECK(state["replicas"].array.at(1)["node"].string == "n0");
  CHECK(head.output().find("node n0 was lost") == std::string::npos);
}
