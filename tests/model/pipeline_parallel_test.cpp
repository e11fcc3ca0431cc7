// How a model's layers are cut into pipeline stages: balanced by default, or as a layer
// partition says (vLLM's VLLM_PP_LAYER_PARTITION); what cannot be cut is refused.
#include <catch2/catch.hpp>

#include "model/pipeline_parallel.hpp"

using namespace troupe;
using model::LayerRange;

TEST_CASE("balanced stages give the remainder to the first ones", "[model][pp]") {
  auto two = model::stage_layers(12, 2);
  REQUIRE(two.has_value());
  CHECK(*two == std::vector<LayerRange>{{0, 6}, {6, 12}});
  auto three = model::stage_layers(26, 3);
  REQUIRE(three.has_value());
  CHECK(*three == std::vector<LayerRange>{{0, 9}, {9, 18}, {18, 26}});
  auto one = model::stage_layers(5, 1);
  REQUIRE(one.has_value());
  CHECK(*one == std::vector<LayerRange>{{0, 5}});
  auto each = model::stage_layers(3, 3);
  REQUIRE(each.has_value());
  CHECK(*each == std::vector<LayerRange>{{0, 1}, {1, 2}, {2, 3}});
  CHECK(model::describe_stages(*three) == "[0, 9) [9, 18) [18, 26)");
}

TEST_CASE("a layer partition sets each stage's layers", "[model][pp]") {
  const std::vector<std::int32_t> partition = {1, 3};
  auto stages = model::stage_layers(4, 2, partition);
  REQUIRE(stages.has_value());
  CHECK(*stages == std::vector<LayerRange>{{0, 1}, {1, 4}});
  auto last = model::pipeline_stage(4, 1, 2, partition);
  REQUIRE(last.has_value());
  CHECK(last->layer_begin == 1);
  CHECK(last->layer_end == 4);
  CHECK(last->is_last());
  CHECK_FALSE(last->is_first());
  CHECK(last->is_staged());
}

TEST_CASE("what cannot be cut into stages is refused, saying why", "[model][pp]") {
  const auto error = [](auto result) {
    REQUIRE_FALSE(result.has_value());
    CHECK(result.error().code == ErrorCode::invalid_argument);
    return result.error().message;
  };
  CHECK_THAT(error(model::stage_layers(4, 0)), Catch::Contains("at least one stage, not 0"));
  CHECK_THAT(error(model::stage_layers(4, -1)), Catch::Contains("at least one stage"));
  CHECK_THAT(error(model::stage_layers(4, 5)),
             Catch::Contains("4 layers cannot be cut into 5 stages"));
  const std::vector<std::int32_t> short_sum = {2, 1};
  CHECK_THAT(error(model::stage_layers(4, 2, short_sum)),
             Catch::Contains("adds up to 3 layers, the model has 4"));
  const std::vector<std::int32_t> three = {2, 1, 1};
  CHECK_THAT(error(model::stage_layers(4, 2, three)),
             Catch::Contains("has 3 stages, the pipeline 2"));
  const std::vector<std::int32_t> empty_stage = {4, 0};
  CHECK_THAT(error(model::stage_layers(4, 2, empty_stage)), Catch::Contains("at least one layer"));
  CHECK_THAT(error(model::pipeline_stage(4, 2, 2)), Catch::Contains("stage 2 of 2"));
}

TEST_CASE("a layer partition is read from its command-line text", "[model][pp]") {
  auto parsed = model::parse_layer_partition("6,6");
  REQUIRE(parsed.has_value());
  CHECK(*parsed == std::vector<std::int32_t>{6, 6});
  auto spaced = model::parse_layer_partition(" 9, 9 ,8");
  REQUIRE(spaced.has_value());
  CHECK(*spaced == std::vector<std::int32_t>{9, 9, 8});
  for (const char* bad : {"", "6,", ",6", "6;6", "six", "6,,6", "1.5,2"}) {
    INFO(bad);
    auto refused = model::parse_layer_partition(bad);
    REQUIRE_FALSE(refused.has_value());
    CHECK_THAT(refused.error().message, Catch::Contains("layer counts separated by commas"));
  }
}

TEST_CASE("balance_layers makes the costliest stage as cheap as it can be", "[model][pp]") {
  const std::vector<double> equal(12, 1.0);
  // No head: the balanced split, the remainder to the first stages.
  CHECK(model::balance_layers(equal, 0.0, 2) == std::vector<std::int32_t>{6, 6});
  const std::vector<double> thirteen(13, 1.0);
  CHECK(model::balance_layers(thirteen, 0.0, 2) == std::vector<std::int32_t>{7, 6});
  CHECK(model::balance_layers(std::vector<double>(26, 1.0), 0.0, 3) ==
        std::vector<std::int32_t>{9, 9, 8});
  // A head that costs 3.5 layers, as a 110M model's 32000 x 768 head against its 7M-weight
  // layers: the last stage takes fewer layers (8 + 4 + 3.5 = 7.5 at most, not 6 + 9.5).
  CHECK(model::balance_layers(equal, 3.5, 2) == std::vector<std::int32_t>{8, 4});
  CHECK(model::balance_layers(equal, 3.5, 3) == std::vector<std::int32_t>{5, 5, 2});
  // A head costlier than every layer together: the last stage still keeps one layer.
  CHECK(model::balance_layers(equal, 100.0, 2) == std::vector<std::int32_t>{11, 1});
  // Uneven layers: the costly one is alone.
  const std::vector<double> uneven = {1, 1, 6, 1, 1, 1};
  CHECK(model::balance_layers(uneven, 0.0, 3) == std::vector<std::int32_t>{2, 1, 3});
  // Every split is optimal: no other contiguous split has a cheaper costliest stage.
  const auto worst = [](const std::vector<double>& costs, double head,
                        const std::vector<std::int32_t>& counts) {
    double most = 0.0;
    std::size_t at = 0;
    for (std::size_t s = 0; s < counts.size(); ++s) {
      double sum = s + 1 == counts.size() ? head : 0.0;
      for (std::int32_t i = 0; i < counts[s]; ++i) sum += costs[at++];
      most = std::max(most, sum);
    }
    return most;
  };
  const std::vector<double> costs = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const auto split = model::balance_layers(costs, 4.0, 3);
  REQUIRE(split.size() == 3);
  for (std::int32_t a = 1; a < 9; ++a) {
    for (std::int32_t b = 1; a + b < 10; ++b) {
      CHECK(worst(costs, 4.0, split) <= worst(costs, 4.0, {a, b, 10 - a - b}));
    }
  }
  // More stages than layers: no split.
  CHECK(model::balance_layers(std::vector<double>(2, 1.0), 0.0, 3).empty());
}
