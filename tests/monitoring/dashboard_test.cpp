// Every query of the Grafana dashboard names metrics the server really exposes, and
// selects the troupe_ ones by the dashboard's model_name variable (as vLLM's does).
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
  const std::regex sample(R"(^((troupe|process)_[a-z0-9_]+))");
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
  const std::regex metric(R"((troupe|process)_[a-z0-9_]+)");
  const std::string by_model = R"({model_name="$model_name")";
  for (const auto& panel : dashboard["panels"].array) {
    for (const auto& target : panel["targets"].array) {
      const std::string& expr = target["expr"].string;
      ++num_queries;
      for (std::sregex_iterator it(expr.begin(), expr.end(), metric), end; it != end; ++it) {
        INFO(panel["title"].string << ": " << expr);
        CHECK(exposed.count(it->str()) == 1);
        if (it->str().rfind("troupe_", 0) == 0) {
          CHECK(expr.compare(it->position() + it->length(), by_model.size(), by_model) == 0);
        }
      }
    }
  }
  CHECK(num_queries >= 24);

  // The model_name variable lists the values of an exposed metric's label.
  const test::Json* variable = nullptr;
  for (const auto& each : dashboard["templating"]["list"].array) {
    if (each["name"].string == "model_name") variable = &each;
  }
  REQUIRE(variable != nullptr);
  std::smatch m;
  const std::string& definition = (*variable)["definition"].string;
  REQUIRE(std::regex_match(definition, m,
                           std::regex(R"(label_values\((troupe_[a-z0-9_]+), model_name\))")));
  CHECK(exposed.count(m[1]) == 1);
  CHECK(exposition.find(m[1].str() + R"({model_name="troupe"})") != std::string::npos);
}

TEST_CASE("the Prometheus scrape config points at the server's /metrics", "[monitoring]") {
  const std::string config =
      test::read_text(std::string(TROUPE_SOURCE_DIR) + "/monitoring/prometheus/prometheus.yml");
  CHECK(config.find("metrics_path: /metrics") != std::string::npos);
  CHECK(config.find("127.0.0.1:8000") != std::string::npos);
}
