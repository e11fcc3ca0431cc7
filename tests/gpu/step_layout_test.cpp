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
  CHECK(l.partition == 64);   // two decode rows split finely
  CHECK(l.num_splits == 10);  // 600 keys in partitions of 64
  CHECK(l.positions[0] == 5);
  CHECK(l.positions[34] == 39);
  CHECK(l.logit_row_index == std::vector<std::int32_t>{34, 35, 36});
  for (std::int32_t t = 0; t < l.rows; ++t) {
    const std::int32_t s = l.token_seq[t];
    const std::int32_t pos = l.positions[t];
    CHECK(l.slots[t] == l.block_tables[s * l.block_stride + pos / 4] * 4 + pos % 4);
  }
}

TEST_CASE("a decode graph's grid follows the step's contexts, not the model's length",
          "[gpu][layout]") {
  CHECK(gpu::graph_splits_for(1) == 1);
  CHECK(gpu::graph_splits_for(2) == 2);
  CHECK(gpu::graph_splits_for(3) == 4);
  CHECK(gpu::graph_splits_for(5) == 8);
  CHECK(gpu::graph_splits_for(32) == 32);
  // A 128K-token model: graphs reach kGraphMaxContext, as the backend sets its policy.
  GraphPolicy policy;
  policy.max_model_len = std::min(131072, gpu::kGraphMaxContext);
  const auto batch = [](std::int32_t n, std::int32_t context) {
    return test::make_step(std::vector<std::int32_t>(n, context), std::vector<std::int32_t>(n, 1),
                           16);
  };
  // 256 sequences at 1000 keys: four partitions each, not 131072 / 256 = 512.
  const auto l = plan_step(batch(256, 1000), 16, policy);
  REQUIRE(l.graph);
  CHECK(l.num_splits == 4);
  CHECK(l.block_stride == 1024 / 16);
  // The split count and the tables' reach are recorded in the graph: they are in its key.
  CHECK(plan_step(batch(256, 1024), 16, policy).graph_key == l.graph_key);
  CHECK(plan_step(batch(256, 1025), 16, policy).graph_key != l.graph_key);
  CHECK(plan_step(batch(256, 1025), 16, policy).num_splits == 8);
  CHECK(plan_step(batch(200, 1000), 16, policy).graph_key != l.graph_key);  // batch 208
  CHECK(plan_step(batch(16, 256), 16, policy).num_splits == 1);
  CHECK(plan_step(batch(16, 257), 16, policy).num_splits == 2);
  // At the graphs' reach: 32 partitions of 256, tables of 8192 keys.
  const auto full = plan_step(batch(16, 8192), 16, policy);
  REQUIRE(full.graph);
  CHECK(full.num_splits == 32);
  CHECK(full.block_stride == 8192 / 16);
  SECTION("beyond the graphs' reach a step runs eagerly, split by its own longest row") {
    const auto eager = plan_step(batch(16, 20000), 16, policy);
    CHECK_FALSE(eager.graph);
    CHECK(eager.num_splits == (20000 + 255) / 256);
    CHECK(plan_step(batch(4, 20000), 16, policy).num_splits == (20000 + 127) / 128);
  }
  SECTION("a long prefill beside decodes does not widen the decodes' grid") {
    // A 2048-token chunk reaching 32K keys, and two decodes at 300 keys.
    const auto mixed = plan_step(test::make_step({32768, 300, 120}, {2048, 1, 1}, 16), 16, policy);
    CHECK_FALSE(mixed.graph);
    CHECK(mixed.num_splits == 5);  // 300 keys in partitions of 64 (two decode rows)
    CHECK(mixed.decode_rows.size() == 2u);
    CHECK(mixed.block_stride == 32768 / 16);  // the prefill's tables still fit
    // A prefill alone needs no decode scratch at all.
    const auto prefill = plan_step(test::make_step({32768}, {2048}, 16), 16, policy);
    CHECK(prefill.num_splits == 1);
    CHECK(gpu::decode_partial_floats(static_cast<std::int64_t>(prefill.decode_rows.size()), 32,
                                     prefill.num_splits, 128) == 0);
  }
}

TEST_CASE("small decode batches split their contexts finer, in graphs too", "[gpu][layout]") {
  CHECK(gpu::decode_partition_for(1) == 64);
  CHECK(gpu::decode_partition_for(2) == 64);
  CHECK(gpu::decode_partition_for(3) == 128);
  CHECK(gpu::decode_partition_for(8) == 128);
  CHECK(gpu::decode_partition_for(9) == gpu::kernels::kDecodePartition);
  GraphPolicy policy;
  policy.max_model_len = 8192;
  const auto batch = [](std::int32_t n, std::int32_t context) {
    return test::make_step(std::vector<std::int32_t>(n, context), std::vector<std::int32_t>(n, 1),
                           16);
  };
  // Batch 1 at 512 keys: 8 partitions of 64 (with Llama-3-8B's 8 KV heads, 64 blocks, not 16).
  const auto one = plan_step(batch(1, 512), 16, policy);
  REQUIRE(one.graph);
  CHECK(one.partition == 64);
  CHECK(one.num_splits == 8);
  CHECK(one.block_stride == 512 / 16);  // the graph's tables reach splits x partition
  // Three rows pad to a graph of 4, which splits by 128: the padded batch decides.
  const auto three = plan_step(batch(3, 512), 16, policy);
  REQUIRE(three.graph);
  CHECK(three.rows == 4);
  CHECK(three.partition == 128);
  CHECK(three.num_splits == 4);
  // The reserved scratch still holds every graph batch's partials in one launch.
  const std::int64_t reserved = gpu::reserved_decode_floats(policy, 32, 128);
  for (const std::int32_t rows : gpu::graph_batch_sizes(policy.max_batch)) {
    const auto l = plan_step(batch(rows, 8192), 16, policy);
    CHECK(gpu::decode_rows_per_launch(reserved, rows, 32, l.num_splits, 128) == rows);
  }
}

TEST_CASE("a step with LoRA adapters runs eagerly and carries each row's slot", "[gpu][layout]") {
  GraphPolicy policy;
  policy.max_model_len = 8192;
  auto step = test::make_step({40, 12, 30}, {1, 1, 1}, 16);
  CHECK(plan_step(step, 16, policy).graph);
  CHECK(plan_step(step, 16, policy).lora_slots.empty());
  step.adapters = {0, 0, 0};  // every row the base model's: a graph as before
  CHECK(plan_step(step, 16, policy).graph);
  step.adapters = {2, 0, 1};
  const auto l = plan_step(step, 16, policy);
  CHECK_FALSE(l.graph);
  CHECK(l.rows == 3);
  CHECK(l.lora_slots == std::vector<std::int32_t>{2, 0, 1});
  // A prompt's rows all take its sequence's slot.
  auto mixed = test::make_step({5, 3}, {5, 1}, 16);
  mixed.adapters = {1, 3};
  CHECK(plan_step(mixed, 16, policy).lora_slots == std::vector<std::int32_t>{1, 1, 1, 1, 1, 3});
}

TEST_CASE("decode scratch is reserved before the KV pool, bounded for 8K, 32K and 128K models",
          "[gpu][layout]") {
  // Llama-3-8B's attention: 32 query heads of 128 dims; graphs up to batch 256.
  const std::int32_t heads = 32, head_dim = 128;
  std::int64_t reserved = 0;
  for (const std::int32_t model_len : {8192, 32768, 131072}) {
    INFO("max_model_len " << model_len);
    GraphPolicy policy;
    policy.max_model_len = std::min(model_len, gpu::kGraphMaxContext);
    const std::int64_t floats = gpu::reserved_decode_floats(policy, heads, head_dim);
    // 256 rows x 32 heads x 32 partitions x 130 floats: 136 MB, whatever the model's length
    // (sized by the model's length it would be 2.2 GB at 128K).
    CHECK(floats * 4 == std::int64_t{256} * 32 * 32 * 130 * 4);
    if (reserved != 0) CHECK(floats == reserved);
    reserved = floats;
  }
  SECTION("a graph's whole batch fits in one launch") {
    CHECK(gpu::decode_rows_per_launch(reserved, 256, heads, 32, head_dim) == 256);
    CHECK(gpu::decode_rows_per_launch(reserved, 100, heads, 32, head_dim) == 100);
  }
  SECTION("an eager step at 128K keys launches its rows in chunks that fit") {
    const std::int32_t splits = 131072 / 256;
    const std::int32_t chunk = gpu::decode_rows_per_launch(reserved, 64, heads, splits, head_dim);
    CHECK(chunk == 16);
    CHECK(gpu::decode_partial_floats(chunk, heads, splits, head_dim) <= reserved);
    CHECK(gpu::decode_partial_floats(chunk + 1, heads, splits, head_dim) > reserved);
  }
  SECTION("one split needs no scratch, and at least one row always launches") {
    CHECK(gpu::decode_partial_floats(256, heads, 1, head_dim) == 0);
    CHECK(gpu::decode_rows_per_launch(reserved, 7, heads, 1, head_dim) == 7);
    CHECK(gpu::decode_rows_per_launch(10, 3, heads, 64, head_dim) == 1);
  }
}
