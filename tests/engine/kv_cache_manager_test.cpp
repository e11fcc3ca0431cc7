#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>

#include "engine/kv_cache_manager.hpp"

using namespace troupe;
using namespace troupe::engine;

namespace {

Sequence make_seq(SeqId id, std::vector<TokenId> tokens) {
  Sequence s;
  s.id = id;
  s.tokens = std::move(tokens);
  s.num_prompt_tokens = s.num_tokens();
  return s;
}

std::vector<TokenId> range(TokenId first, int n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// Admits a sequence the way the scheduler does, computes all its tokens, caches them.
void run_prompt(KvCacheManager& kv, Sequence& seq) {
  const auto prefix = kv.find_cached_prefix(seq);
  const auto computed = static_cast<std::int32_t>(prefix.size()) * kv.block_size();
  REQUIRE(kv.allocate_slots(seq, seq.num_tokens() - computed, prefix));
  seq.num_computed_tokens = seq.num_tokens();
  kv.cache_full_blocks(seq);
}

}  // namespace

TEST_CASE("allocation is all or nothing", "[engine][kv]") {
  KvCacheManager kv(4, 4, true);
  Sequence a = make_seq(1, range(0, 10));  // 3 blocks
  REQUIRE(kv.allocate_slots(a, 10));
  CHECK(a.block_table == std::vector<BlockId>{0, 1, 2});
  Sequence b = make_seq(2, range(100, 8));  // needs 2, only 1 left
  CHECK_FALSE(kv.allocate_slots(b, 8));
  CHECK(b.block_table.empty());
  CHECK(kv.num_free_blocks() == 1);
  CHECK(kv.usage() == Approx(0.75));
}

TEST_CASE("a second chat turn reuses every full block of the first (the append case)",
          "[engine][kv]") {
  KvCacheManager kv(16, 4, true);
  // Turn 1: 10 prompt tokens + 3 generated = 13 tokens: 3 full blocks.
  Sequence turn1 = make_seq(1, range(0, 10));
  run_prompt(kv, turn1);
  for (TokenId t : {50, 51, 52}) {
    turn1.tokens.push_back(t);
    REQUIRE(kv.allocate_slots(turn1, 1));
    turn1.num_computed_tokens += 1;
    kv.cache_full_blocks(turn1);
  }
  const std::vector<BlockId> first_blocks(turn1.block_table.begin(), turn1.block_table.begin() + 3);
  kv.free(turn1);
  // Turn 2 appends the user's next message to the whole first conversation.
  std::vector<TokenId> prompt2 = turn1.tokens;
  for (TokenId t : range(200, 6)) prompt2.push_back(t);
  Sequence turn2 = make_seq(2, prompt2);
  const auto prefix = kv.find_cached_prefix(turn2);
  CHECK(prefix == first_blocks);
  REQUIRE(kv.allocate_slots(turn2, turn2.num_tokens() - 12, prefix));
  CHECK(turn2.num_computed_tokens == 12);
  CHECK(turn2.num_cached_tokens == 12);
  CHECK(std::vector<BlockId>(turn2.block_table.begin(), turn2.block_table.begin() + 3) ==
        first_blocks);
  CHECK(kv.prefix_stats().num_hit_tokens == 12);
}

TEST_CASE("a fully cached prompt still computes its last token", "[engine][kv]") {
  KvCacheManager kv(8, 4, true);
  Sequence a = make_seq(1, range(0, 8));
  run_prompt(kv, a);
  kv.free(a);
  Sequence b = make_seq(2, range(0, 8));
  CHECK(kv.find_cached_prefix(b).size() == 1);  // 2 blocks match, but only 7 tokens may be reused
}

TEST_CASE("eviction takes unreferenced cached blocks only, least recently used first",
          "[engine][kv]") {
  KvCacheManager kv(6, 2, true);
  Sequence a = make_seq(1, range(0, 5));   // blocks 0,1 full, 2 partial
  Sequence b = make_seq(2, range(10, 5));  // blocks 3,4 full, 5 partial
  run_prompt(kv, a);
  run_prompt(kv, b);
  CHECK(a.block_table == std::vector<BlockId>{0, 1, 2});
  CHECK(b.block_table == std::vector<BlockId>{3, 4, 5});
  kv.free(a);  // frees 2 (plain), then 1, 0 (cached, in that order)
  kv.free(b);  // frees 5 (plain), then 4, 3 (cached)
  CHECK(kv.num_free_blocks() == 6);
  // A newcomer needing 4 blocks takes the 2 plain ones, then evicts 1 and 0 (a's
  // tail first, since it was freed first), leaving b's prefix cached.
  Sequence c = make_seq(3, range(100, 7));
  REQUIRE(kv.allocate_slots(c, 7));
  CHECK(c.block_table == std::vector<BlockId>{5, 2, 1, 0});
  CHECK(kv.prefix_stats().num_evicted_blocks == 2);
  CHECK(kv.find_cached_prefix(make_seq(4, range(0, 5))).empty());
  CHECK(kv.find_cached_prefix(make_seq(5, range(10, 5))) == std::vector<BlockId>{3, 4});
}

TEST_CASE("a referenced prefix is never evicted", "[engine][kv]") {
  KvCacheManager kv(4, 2, true);
  Sequence a = make_seq(1, range(0, 5));
  run_prompt(kv, a);  // holds 0,1,2
  Sequence b = make_seq(2, range(0, 5));
  const auto prefix = kv.find_cached_prefix(b);
  REQUIRE(prefix == std::vector<BlockId>{0, 1});
  REQUIRE(kv.allocate_slots(b, 1, prefix));  // shares 0,1 and takes 3
  CHECK(kv.pool().ref_count(0) == 2);
  Sequence c = make_seq(3, range(50, 3));
  CHECK_FALSE(kv.allocate_slots(c, 3));  // nothing evictable
  kv.free(a);
  CHECK(kv.pool().ref_count(0) == 1);
  CHECK_FALSE(kv.allocate_slots(c, 3));  // only block 2 is free: not enough
}

TEST_CASE("without prefix caching nothing is shared", "[engine][kv]") {
  KvCacheManager kv(8, 2, false);
  Sequence a = make_seq(1, range(0, 5));
  run_prompt(kv, a);
  kv.free(a);
  CHECK(kv.find_cached_prefix(make_seq(2, range(0, 5))).empty());
  CHECK(kv.prefix_cache().size() == 0);
}

TEST_CASE("a router's question, how much of a prompt is cached, changes no statistic",
          "[engine][kv]") {
  KvCacheManager kv(16, 4, true);
  Sequence first = make_seq(1, range(0, 10));  // 2 full blocks enter the cache
  run_prompt(kv, first);
  const PrefixCacheStats before = kv.prefix_stats();
  CHECK(kv.cached_prefix_tokens(range(0, 12)) == 8);
  CHECK(kv.cached_prefix_tokens(range(0, 6)) == 4);  // whole blocks only
  CHECK(kv.cached_prefix_tokens(range(0, 8)) == 4);  // never the whole prompt
  CHECK(kv.cached_prefix_tokens(range(1, 12)) == 0);
  CHECK(kv.cached_prefix_tokens({}) == 0);
  CHECK(kv.prefix_stats().num_queried_tokens == before.num_queried_tokens);
  CHECK(kv.prefix_stats().num_hit_tokens == before.num_hit_tokens);

  KvCacheManager off(16, 4, false);
  Sequence again = make_seq(1, range(0, 10));
  run_prompt(off, again);
  CHECK(off.cached_prefix_tokens(range(0, 12)) == 0);
}

TEST_CASE("a prefix computed under one LoRA adapter is never reused under another",
          "[engine][kv][lora]") {
  KvCacheManager kv(32, 4, true);
  Sequence base = make_seq(1, range(0, 13));  // 3 full blocks
  run_prompt(kv, base);
  Sequence adapted = make_seq(2, range(0, 13));
  adapted.adapter = 1;
  CHECK(kv.find_cached_prefix(adapted).empty());
  CHECK(kv.cached_prefix_tokens(adapted.tokens, 1) == 0);
  CHECK(kv.cached_prefix_tokens(adapted.tokens, 0) == 12);
  run_prompt(kv, adapted);
  // Its own blocks, cached under adapter 1: a second request of adapter 1 finds them, one
  // of adapter 2 finds nothing, the base model still finds the base's.
  for (BlockId b : adapted.block_table) {
    CHECK(std::find(base.block_table.begin(), base.block_table.end(), b) == base.block_table.end());
  }
  Sequence again = make_seq(3, range(0, 13));
  again.adapter = 1;
  const auto hit = kv.find_cached_prefix(again);
  CHECK(hit == std::vector<BlockId>(adapted.block_table.begin(), adapted.block_table.begin() + 3));
  Sequence other = make_seq(4, range(0, 13));
  other.adapter = 2;
  CHECK(kv.find_cached_prefix(other).empty());
  Sequence base_again = make_seq(5, range(0, 13));
  CHECK(kv.find_cached_prefix(base_again) ==
        std::vector<BlockId>(base.block_table.begin(), base.block_table.begin() + 3));
}

TEST_CASE("the prefix cache keeps a root per adapter, and erases from the right one",
          "[engine][kv][lora]") {
  PrefixCache cache(8, 4);
  const auto tokens = range(0, 8);
  const std::span<const TokenId> first(tokens.data(), 4), second(tokens.data() + 4, 4);
  CHECK(cache.insert(kNoBlock, first, 0, 1) == 0);
  CHECK(cache.insert(0, second, 1) == 1);  // below adapter 1's block: adapter 1's
  CHECK(cache.insert(kNoBlock, first, 2, 0) == 2);
  CHECK(cache.insert(kNoBlock, first, 3, 1) == 0);  // adapter 1 has it already
  CHECK(cache.match(tokens, 2, 1) == std::vector<BlockId>{0, 1});
  CHECK(cache.match(tokens, 2, 0) == std::vector<BlockId>{2});
  CHECK(cache.match(tokens, 2, 5).empty());
  std::vector<BlockId> removed;
  cache.erase(0, removed);
  CHECK(removed == std::vector<BlockId>{0, 1});
  CHECK(cache.match(tokens, 2, 1).empty());
  CHECK(cache.match(tokens, 2, 0) == std::vector<BlockId>{2});
  CHECK(cache.size() == 1u);
}

TEST_CASE("a LoRA slot that holds another adapter forgets its prefixes, and only its own",
          "[engine][kv][lora]") {
  KvCacheManager kv(32, 4, true);
  Sequence base = make_seq(1, range(0, 13));
  run_prompt(kv, base);
  Sequence adapted = make_seq(2, range(0, 13));
  adapted.adapter = 1;
  run_prompt(kv, adapted);
  kv.free(adapted);
  REQUIRE(kv.cached_prefix_tokens(adapted.tokens, 1) == 12);
  const std::int32_t free_before = kv.num_free_blocks();
  kv.forget_adapter(1);
  CHECK(kv.cached_prefix_tokens(adapted.tokens, 1) == 0);
  CHECK(kv.cached_prefix_tokens(base.tokens, 0) == 12);  // the base keeps its own
  CHECK(kv.num_free_blocks() == free_before);            // its blocks are plain free ones now
  CHECK(kv.pool().num_evictable() == 0);

  // A sequence still holding such blocks keeps them, and caches no more below them.
  Sequence held = make_seq(3, range(100, 9));
  held.adapter = 2;
  run_prompt(kv, held);
  kv.forget_adapter(2);
  held.tokens.push_back(7);
  held.tokens.push_back(8);
  held.tokens.push_back(9);
  held.tokens.push_back(10);
  REQUIRE(kv.allocate_slots(held, 4));
  held.num_computed_tokens = held.num_tokens();
  kv.cache_full_blocks(held);
  CHECK(kv.cached_prefix_tokens(held.tokens, 2) == 0);
  kv.free(held);
  kv.free(base);
  CHECK(kv.num_free_blocks() == kv.num_blocks());
}
