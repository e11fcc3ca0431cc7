// bench/throughput's report: what `troupe bench throughput --output-json` writes.
#include "bench/throughput.hpp"

#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <filesystem>

#include "model/random_model.hpp"
#include "support/small_model.hpp"
#include "support/test_support.hpp"

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

TEST_CASE("bench throughput spreads its requests over LoRA adapters and times their load",
          "[bench][lora]") {
  const std::string base_path = test::write_small_model("bench-lora-base");
  bench::ThroughputOptions o;
  o.engine.model_path = base_path;
  o.engine.num_threads = 1;
  o.engine.kv_cache_bytes = 8 << 20;
  for (int i = 1; i <= 2; ++i) {
    model::RandomAdapterSpec adapter;
    adapter.base_path = base_path;
    adapter.rank = 4;
    adapter.seed = static_cast<std::uint64_t>(i);
    const std::string path = test::temp_path("bench-lora-" + std::to_string(i) + ".gguf");
    REQUIRE(model::write_random_adapter(adapter, path).has_value());
    o.engine.lora_adapters.push_back(path);
  }
  o.workload.num_prompts = 4;
  o.workload.input_len = 8;
  o.workload.output_len = 4;
  o.temperature = 0.0f;
  const auto r = bench::run_throughput(o);
  REQUIRE(r.has_value());
  CHECK(r->totals.completed == 4);
  CHECK(r->totals.total_output_tokens == 16);
  CHECK(r->mean_lora_load_ms > 0.0);
  auto json = boost::json::parse(bench::to_json(o, *r)).as_object();
  CHECK(json["num_lora_adapters"].as_int64() == 2);
  CHECK(json["mean_lora_load_ms"].as_double() > 0.0);
  o.engine.lora_adapters.push_back(test::temp_path("no-such-adapter.gguf"));
  const auto missing = bench::run_throughput(o);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().message.find("no-such-adapter") != std::string::npos);
  for (const auto& path : o.engine.lora_adapters) std::filesystem::remove(path);
  std::filesystem::remove(base_path);
}
