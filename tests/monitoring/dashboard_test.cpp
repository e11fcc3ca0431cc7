// Every query of the Grafana dashboard names metrics the server really exposes.
#include <catch2/catch.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "monitoring/metrics.hpp"
#include "support/mini_json.hpp"
#include "support/test_support.hpp"

using namespace troupe;

TEST_CASE("every dashboard query names an exposed metric", "[monitoring]") {
  monitoring::Metrics metrics;
  // Labelled families appear once they have a child.
  metrics.observe_request("stop", 1.0, 0.1, 0.01, true);
  metrics.count_http("/v1/completions", 200);
  metrics.set_replica_up(0, true);
  metrics.set_replica_load(0, 1, 2, 0.5, 100);
  metrics.record_replica_loss(0, 1);
  const std::string exposition = metrics.serialize();
  std::set<std::string> exposed;
  const std::regex sample(R"(^(troupe_[a-z_]+))");
  std::istringstream lines(exposition);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, sample)) exposed.insert(m[1]);
  }
  REQUIRE(exposed.size() > 20);

  const auto dashboard =
      test::JsonParser(test::read_text(std::string(TROUPE_SOURCE_DIR) +
                                       "/monitoring/grafana/troupe-dashboard.json"))
          .parse();
  std::size_t num_queries = 0;
  const std::regex metric(R"(troupe_[a-z_]+)");
  for (const auto& panel : dashboard["panels"].array) {
    for (const auto& target : panel["targets"].array) {
      const std::string& expr = target["expr"].string;
      ++num_queries;
      for (std::sregex_iterator it(expr.begin(), expr.end(), metric), end; it != end; ++it) {
        INFO(panel["title"].string << ": " << expr);
        CHECK(exposed.count(it->str()) == 1);
      }
    }
  }
  CHECK(num_queries >= 24);
}

TEST_CASE("the Prometheus scrape config points at the server's /metrics", "[monitoring]") {
  const std::string config =
      test::read_text(std::string(TROUPE_SOURCE_DIR) + "/monitoring/prometheus/prometheus.yml");
  CHECK(config.find("metrics_path: /metrics") != std::string::npos);
  CHECK(config.find("127.0.0.1:8000") != std::string::npos);
}
