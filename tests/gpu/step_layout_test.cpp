// The GPU backend's host-side plan of a step: padding to CUDA-graph batch sizes,
// KV slots, decode rows and prefill tiles. No device needed.
#include <catch2/catch.hpp>

#include "gpu/step_layout.hpp"
#include "gpu/steps.hpp"

using namespace troupe;
using gpu::GraphPolicy;
using gpu::plan_step;

namespace {

model::StepInput make_step(const std::vector<std::int32_t>& lengths,
                           const std::vector<std::int32_t>& new_tokens, bool all_logits = true) {
  return test::make_step(lengths, new_tokens, 4, all_logits);
}

}  // namespace

TEST_CASE("graph batch sizes grow as vLLM's do and cover every batch up to the largest",
          "[gpu][layout]") {
  const auto sizes = gpu::graph_batch_sizes(256);
  REQUIRE(sizes.front() == 1);
  REQUIRE(sizes.back() == 256);
  CHECK(std::vector<std::int32_t>(sizes.begin(), sizes.begin() + 6) ==
        std::vector<std::int32_t>{1, 2, 4, 8, 16, 24});
  for (std::size_t i = 1; i < sizes.size(); ++i) CHECK(sizes[i] > sizes[i - 1]);
  for (std::int32_t n = 1; n <= 256; ++n) {
    const std::int32_t b = gpu::graph_batch_for(n, 256);
    CHECK(b >= n);
    CHECK(std::find(sizes.begin(), sizes.end(), b) != sizes.end());
  }
  CHECK(gpu::graph_batch_for(3, 256) == 4);
  CHECK(gpu::graph_batch_for(65, 256) == 80);
  CHECK(gpu::graph_batch_for(257, 256) == 0);
  CHECK(gpu::graph_batch_for(0, 256) == 0);
  // A limit off the ladder (--max-num-seqs 100) still has its own size.
  CHECK(gpu::graph_batch_sizes(100).back() == 100);
  CHECK(gpu::graph_batch_for(97, 100) == 100);
  CHECK(gpu::graph_batch_for(96, 100) == 96);
  CHECK(gpu::graph_batch_sizes(3) == std::vector<std::int32_t>{1, 2, 3});
}

TEST_CASE("a decode-only step pads to its graph's batch with rows that touch nothing",
          "[gpu][layout]") {
  const auto step = make_step({5, 9, 2}, {1, 1, 1});
  GraphPolicy policy;
  policy.max_model_len = 64;
  const auto l = plan_step(step, 4, policy);
  REQUIRE(l.graph);
  CHECK(l.rows == 4);
  CHECK(l.logit_rows == 4);
  CHECK(l.real_rows == 3);
  CHECK(gpu::planned_rows(step, policy) == 4);
  CHECK(l.block_stride == 16);  // max_model_len / block_size, whatever the step's own tables
  CHECK(l.num_splits == 1);
  CHECK(l.tokens == std::vector<std::int32_t>{10, 11, 12, 0});
  CHECK(l.positions == std::vector<std::int32_t>{4, 8, 1, 0});
  CHECK(l.token_seq == std::vector<std::int32_t>{0, 1, 2, -1});
  // Sequence 0 owns blocks 0-1, sequence 1 blocks 2-4, sequence 2 block 5.
  CHECK(l.slots == std::vector<std::int32_t>{1 * 4 + 0, 4 * 4 + 0, 5 * 4 + 1, -1});
  CHECK(l.logit_row_index == std::vector<std::int32_t>{0, 1, 2, 3});
  CHECK(l.decode_rows == std::vector<std::int32_t>{0, 1, 2, 3});
  CHECK(l.tiles.empty());
  REQUIRE(l.block_tables.size() == 3u * 16u);
  CHECK(l.block_tables[16 + 2] == 4);
}

TEST_CASE("graphs serve only decode steps within their length, and only when enabled",
          "[gpu][layout]") {
  GraphPolicy policy;
  policy.max_model_len = 8;
  SECTION("a sequence longer than the graphs' reach") {
    const auto l = plan_step(make_step({5, 9}, {1, 1}), 4, policy);
    CHECK_FALSE(l.graph);
    CHECK(l.rows == 2);
    CHECK(l.block_stride == 3);
  }
  SECTION("graphs off") {
    policy.enabled = false;
    CHECK_FALSE(plan_step(make_step({5, 6}, {1, 1}), 4, policy).graph);
  }
  SECTION("no max_model_len") {
    policy.max_model_len = 0;
    CHECK_FALSE(plan_step(make_step({5, 6}, {1, 1}), 4, policy).graph);
  }
  SECTION("a row without logits") {
    CHECK_FALSE(plan_step(make_step({5, 6}, {1, 1}, false), 4, policy).graph);
  }
  SECTION("a prefill among the decodes") {
    CHECK_FALSE(plan_step(make_step({5, 6}, {1, 3}), 4, policy).graph);
  }
}

TEST_CASE("a mixed step sends single queries to decode and the rest in tiles of 16",
          "[gpu][layout]") {
  const auto step = make_step({40, 7, 600}, {35, 1, 1});
  const auto l = plan_step(step, 4, GraphPolicy{});
  CHECK_FALSE(l.graph);
  CHECK(l.rows == 37);
  CHECK(l.logit_rows == 3);
  REQUIRE(l.tiles.size() == 3u);
  CHECK(l.tiles[0].first_row == 0);
  CHECK(l.tiles[0].num_rows == 16);
  CHECK(l.tiles[2].first_row == 32);
  CHECK(l.tiles[2].num_rows == 3);
  CHECK(l.decode_rows == std::vector<std::int32_t>{35, 36});
  CHECK(l.num_splits == 3);  // 600 keys in partitions of 256
  CHECK(l.positions[0] == 5);
  CHECK(l.positions[34] == 39);
  CHECK(l.logit_row_index == std::vector<std::int32_t>{34, 35, 36});
  for (std::int32_t t = 0; t < l.rows; ++t) {
    const std::int32_t s = l.token_seq[t];
    const std::int32_t pos = l.positions[t];
    CHECK(l.slots[t] == l.block_tables[s * l.block_stride + pos / 4] * 4 + pos % 4);
  }
}
