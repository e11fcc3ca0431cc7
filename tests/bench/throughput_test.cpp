// bench/throughput's report: what `troupe bench throughput --output-json` writes.
#include "bench/throughput.hpp"

#include <boost/json.hpp>
#include <catch2/catch.hpp>

using namespace troupe;

TEST_CASE("bench throughput's JSON has a token budget only where one is in force", "[bench]") {
  bench::ThroughputOptions o;
  o.engine.auto_token_budget = true;
  o.engine.target_itl_ms = 150.0;
  const bench::ThroughputResult r;
  o.engine.mode = BatchingMode::continuous;
  auto json = boost::json::parse(bench::to_json(o, r)).as_object();
  CHECK(json["auto_token_budget"].as_bool());
  CHECK(json["target_itl_ms"].as_double() == 150.0);
  o.engine.mode = BatchingMode::static_batch;  // static batching has none
  json = boost::json::parse(bench::to_json(o, r)).as_object();
  CHECK_FALSE(json["auto_token_budget"].as_bool());
  CHECK_FALSE(json.contains("target_itl_ms"));
}
