#include <catch2/catch.hpp>

#include "model/step_input.hpp"

using namespace troupe;
using namespace troupe::model;

namespace {
const KvCacheShape kCache{1, 8, 4, 1, 2};
}

TEST_CASE("append_sequence flattens sequences and widens block tables", "[step]") {
  StepInput step;
  const std::vector<TokenId> a = {5, 6, 7, 8, 9};
  const std::vector<std::int32_t> table_a = {2, 3};
  append_sequence(step, a, 0, table_a, true);
  const std::vector<TokenId> b = {4};
  const std::vector<std::int32_t> table_b = {0, 1, 4};
  append_sequence(step, b, 9, table_b, true);
  CHECK(step.tokens == std::vector<TokenId>{5, 6, 7, 8, 9, 4});
  CHECK(step.positions == std::vector<std::int32_t>{0, 1, 2, 3, 4, 9});
  CHECK(step.query_start == std::vector<std::int32_t>{0, 5, 6});
  CHECK(step.context_lens == std::vector<std::int32_t>{5, 10});
  CHECK(step.max_blocks_per_seq == 3);
  CHECK(step.block_tables == std::vector<std::int32_t>{2, 3, 0, 0, 1, 4});
  CHECK(step.logit_rows == std::vector<std::int32_t>{4, 5});
  CHECK(validate_step(step, kCache, 10).has_value());
}

TEST_CASE("validate_step rejects what a backend could not index", "[step]") {
  StepInput step;
  const std::vector<TokenId> a = {1, 2, 3};
  const std::vector<std::int32_t> table = {7};
  append_sequence(step, a, 0, table, true);
  REQUIRE(validate_step(step, kCache, 10).has_value());
  SECTION("a token outside the vocabulary") {
    step.tokens[1] = 10;
    CHECK(validate_step(step, kCache, 10).error().message.find("outside the vocabulary") !=
          std::string::npos);
  }
  SECTION("a block outside the cache") {
    step.block_tables[0] = 8;
    CHECK(validate_step(step, kCache, 10).error().message.find("KV block 8") != std::string::npos);
  }
  SECTION("a context that needs more blocks than the table has") {
    step.context_lens[0] = 5;
    CHECK_FALSE(validate_step(step, kCache, 10).has_value());
  }
  SECTION("positions that are not the newest tokens") {
    step.positions[2] = 7;
    CHECK_FALSE(validate_step(step, kCache, 10).has_value());
  }
  SECTION("a logit row outside the batch") {
    step.logit_rows[0] = 3;
    CHECK_FALSE(validate_step(step, kCache, 10).has_value());
  }
}
