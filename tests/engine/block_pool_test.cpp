#include <catch2/catch.hpp>

#include "engine/block_pool.hpp"
#include "engine/prefix_cache.hpp"

using namespace troupe;
using namespace troupe::engine;

namespace {
BlockId take(BlockPool& pool) {
  std::optional<BlockId> evicted;
  const auto b = pool.allocate(evicted);
  REQUIRE(b.has_value());
  REQUIRE_FALSE(evicted.has_value());
  return *b;
}
}  // namespace

TEST_CASE("a fresh pool hands out blocks in order and reuses the last freed first",
          "[engine][pool]") {
  BlockPool pool(4);
  CHECK(take(pool) == 0);
  CHECK(take(pool) == 1);
  CHECK(take(pool) == 2);
  CHECK(pool.num_free() == 1);
  pool.unref(1);
  pool.unref(0);
  CHECK(take(pool) == 0);
  CHECK(take(pool) == 1);
  CHECK(take(pool) == 3);
  std::optional<BlockId> evicted;
  CHECK_FALSE(pool.allocate(evicted).has_value());
}

TEST_CASE("cached free blocks are evicted least recently freed first, after plain ones",
          "[engine][pool]") {
  BlockPool pool(4);
  for (int i = 0; i < 4; ++i) take(pool);
  for (BlockId b : {0, 1, 2}) pool.set_cached(b, true);
  pool.unref(2);  // cached: evictable, least recently freed
  pool.unref(0);  // cached
  pool.unref(3);  // plain
  pool.unref(1);  // cached, most recent
  CHECK(pool.num_free() == 4);
  CHECK(pool.num_evictable() == 3);
  std::optional<BlockId> evicted;
  CHECK(*pool.allocate(evicted) == 3);  // plain first
  CHECK_FALSE(evicted.has_value());
  CHECK(*pool.allocate(evicted) == 2);
  CHECK(evicted == 2);
  CHECK_FALSE(pool.is_cached(2));
  SECTION("a cache hit takes a block out of the eviction order") {
    pool.ref(0);
    CHECK(*pool.allocate(evicted) == 1);
    CHECK(pool.num_free() == 0);
    pool.unref(0);  // back, now the most recent
    CHECK(pool.num_evictable() == 1);
  }
  SECTION("a free block that leaves the cache becomes plain") {
    pool.set_cached(1, false);
    CHECK(pool.num_evictable() == 1);
    CHECK(*pool.allocate(evicted) == 1);
    CHECK_FALSE(evicted.has_value());
  }
}

TEST_CASE("the radix tree matches whole blocks along one path", "[engine][prefix]") {
  PrefixCache cache(8, 2);
  const std::vector<TokenId> a = {1, 2, 3, 4, 5, 6};
  CHECK(cache.insert(kNoBlock, std::span(a).subspan(0, 2), 0) == 0);
  CHECK(cache.insert(0, std::span(a).subspan(2, 2), 1) == 1);
  CHECK(cache.insert(1, std::span(a).subspan(4, 2), 2) == 2);
  const std::vector<TokenId> b = {1, 2, 3, 4, 9, 9};
  CHECK(cache.insert(1, std::span(b).subspan(4, 2), 3) == 3);  // a sibling of block 2
  CHECK(cache.match(a, 10) == std::vector<BlockId>{0, 1, 2});
  CHECK(cache.match(b, 10) == std::vector<BlockId>{0, 1, 3});
  CHECK(cache.match(a, 2) == std::vector<BlockId>{0, 1});
  CHECK(cache.match(std::vector<TokenId>{1, 2, 3}, 10) == std::vector<BlockId>{0});  // partial
  CHECK(cache.match(std::vector<TokenId>{2, 1}, 10).empty());
  SECTION("the same tokens under the same parent are a duplicate") {
    CHECK(cache.insert(0, std::span(a).subspan(2, 2), 5) == 1);
    CHECK_FALSE(cache.contains(5));
  }
  SECTION("the same tokens under another parent are not") {
    CHECK(cache.insert(kNoBlock, std::span(a).subspan(2, 2), 5) == 5);
  }
  SECTION("erasing a block takes its subtree") {
    std::vector<BlockId> removed;
    cache.erase(1, removed);
    std::sort(removed.begin(), removed.end());
    CHECK(removed == std::vector<BlockId>{1, 2, 3});
    CHECK(cache.size() == 1);
    CHECK(cache.match(a, 10) == std::vector<BlockId>{0});
  }
}
