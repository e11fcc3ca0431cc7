// The worker turns a KV budget into blocks: the backend says how many bytes a block
// takes, the spec says the budget, and the pool must hold one whole sequence.
#include <catch2/catch.hpp>

#include "worker/kv_sizing.hpp"

using namespace troupe;

TEST_CASE("the KV pool takes its share of free memory, in whole blocks", "[worker][kv]") {
  constexpr std::int64_t kGiB = std::int64_t{1} << 30;
  CHECK(worker::kv_blocks_for_memory(10 * kGiB, 0.9, 2 << 20, 0) == 4608);
  CHECK(worker::kv_blocks_for_memory(10 * kGiB, 0.9, 2 << 20, 100) == 100);
  CHECK(worker::kv_blocks_for_memory(10 * kGiB, 1.5, 1 << 30, 0) == 10);
  CHECK(worker::kv_blocks_for_memory(0, 0.9, 1024, 0) == 0);
  CHECK(worker::kv_blocks_for_memory(kGiB, 0.0, 1024, 0) == 0);
  CHECK(worker::kv_blocks_for_memory(kGiB, 0.9, 0, 0) == 0);
}

TEST_CASE("a spec's KV budget becomes blocks: explicit, host bytes or free device memory",
          "[worker][kv]") {
  engine::WorkerSpec spec;
  spec.block_size = 16;
  spec.max_model_len = 256;  // one sequence needs 16 blocks
  const std::int64_t block_bytes = 1 << 20;
  SECTION("num_kv_blocks wins over any budget") {
    spec.num_kv_blocks = 40;
    CHECK(worker::kv_blocks_for_budget(spec, block_bytes, std::int64_t{1} << 40) == 40);
    CHECK(worker::kv_blocks_for_budget(spec, block_bytes, std::nullopt) == 40);
  }
  SECTION("on the host, kv_cache_bytes") {
    spec.kv_cache_bytes = std::int64_t{100} << 20;
    CHECK(worker::kv_blocks_for_budget(spec, block_bytes, std::nullopt) == 100);
  }
  SECTION("on a GPU, gpu_memory_utilization of what is free") {
    spec.gpu_memory_utilization = 0.5;
    CHECK(worker::kv_blocks_for_budget(spec, block_bytes, std::int64_t{64} << 20) == 32);
    spec.gpu_memory_utilization = 1.5;
    const auto bad = worker::kv_blocks_for_budget(spec, block_bytes, std::int64_t{64} << 20);
    REQUIRE_FALSE(bad.has_value());
    CHECK(bad.error().message.find("gpu_memory_utilization") != std::string::npos);
    spec.gpu_memory_utilization = 0.9;
    const auto none = worker::kv_blocks_for_budget(spec, block_bytes, 1000);
    REQUIRE_FALSE(none.has_value());
    CHECK(none.error().message.find("no GPU memory is left") != std::string::npos);
  }
  SECTION("a pool that cannot hold one whole sequence is refused, saying the sizes") {
    spec.num_kv_blocks = 15;
    const auto small = worker::kv_blocks_for_budget(spec, block_bytes, std::nullopt);
    REQUIRE_FALSE(small.has_value());
    CHECK(small.error().code == ErrorCode::out_of_range);
    CHECK(small.error().message.find("cannot hold one sequence of 256 tokens") !=
          std::string::npos);
    CHECK(small.error().message.find("(" + std::to_string(block_bytes) + " bytes a block)") !=
          std::string::npos);
    // With a draft model, how much of each block is its cache.
    const auto drafted = worker::kv_blocks_for_budget(spec, block_bytes, std::nullopt, 1024);
    REQUIRE_FALSE(drafted.has_value());
    CHECK(drafted.error().message.find(std::to_string(block_bytes) +
                                       " bytes a block, 1024 of them the draft model's") !=
          std::string::npos);
  }
}
