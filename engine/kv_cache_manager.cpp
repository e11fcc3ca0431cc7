#include "engine/kv_cache_manager.hpp"

#include <algorithm>

#include "troupe/result.hpp"

namespace troupe::engine {

KvCacheManager::KvCacheManager(std::int32_t num_blocks, std::int32_t block_size,
                               bool enable_prefix_caching)
    : block_size_(block_size),
      enable_prefix_caching_(enable_prefix_caching),
      pool_(num_blocks),
      cache_(num_blocks, block_size) {}

double KvCacheManager::usage() const {
  return pool_.num_blocks() == 0 ? 0.0
                                 : 1.0 - static_cast<double>(pool_.num_free()) / pool_.num_blocks();
}

std::vector<BlockId> KvCacheManager::find_cached_prefix(const Sequence& seq) const {
  // A prompt being scored runs every row; its blocks still enter the cache after.
  if (!enable_prefix_caching_ || seq.scores_prompt()) return {};
  const std::int32_t max_blocks = (seq.num_tokens() - 1) / block_size_;
  return cache_.match(seq.tokens, max_blocks, seq.adapter);
}

std::int32_t KvCacheManager::cached_prefix_tokens(std::span<const TokenId> prompt,
                                                  std::int32_t adapter) const {
  if (!enable_prefix_caching_ || prompt.empty()) return 0;
  const auto max_blocks = static_cast<std::int32_t>((prompt.size() - 1) / block_size_);
  return static_cast<std::int32_t>(cache_.match(prompt, max_blocks, adapter).size()) * block_size_;
}

bool KvCacheManager::allocate_slots(Sequence& seq, std::int32_t num_new_tokens,
                                    std::span<const BlockId> cached_prefix) {
  TROUPE_ASSERT(cached_prefix.empty() || seq.block_table.empty(),
                "a cached prefix is only for a sequence holding no blocks");
  const auto num_prefix = static_cast<std::int32_t>(cached_prefix.size());
  const std::int32_t computed =
      seq.block_table.empty() ? num_prefix * block_size_ : seq.num_computed_tokens;
  const std::int32_t needed = blocks_for(computed + num_new_tokens);
  const std::int32_t held = static_cast<std::int32_t>(seq.block_table.size()) + num_prefix;
  const std::int32_t num_new_blocks = std::max(0, needed - held);
  // Prefix blocks that are free now stop being free once referenced.
  std::int32_t prefix_free = 0;
  for (BlockId b : cached_prefix) prefix_free += pool_.ref_count(b) == 0 ? 1 : 0;
  if (num_new_blocks > pool_.num_free() - prefix_free) return false;

  const bool first = seq.block_table.empty();
  for (BlockId b : cached_prefix) {
    pool_.ref(b);
    seq.block_table.push_back(b);
  }
  if (first && enable_prefix_caching_) {
    seq.num_computed_tokens = num_prefix * block_size_;
    seq.num_cached_tokens = seq.num_computed_tokens;
    seq.num_registered_blocks = num_prefix;
    seq.prefix_cache_open = true;
    stats_.num_queried_tokens += seq.num_tokens();
    stats_.num_hit_tokens += seq.num_cached_tokens;
  }
  for (std::int32_t i = 0; i < num_new_blocks; ++i) {
    std::optional<BlockId> evicted;
    const auto block = pool_.allocate(evicted);
    TROUPE_ASSERT(block.has_value(), "the pool ran out after counting enough free blocks");
    if (evicted) {
      removed_.clear();
      cache_.erase(*evicted, removed_);
      ++stats_.num_evicted_blocks;
      // Blocks below an evicted one lose their prefix too. They are free (a sequence
      // holding a block holds its whole prefix), so they become plain free blocks.
      for (BlockId r : removed_) {
        if (r != *evicted) pool_.set_cached(r, false);
      }
    }
    seq.block_table.push_back(*block);
  }
  return true;
}

void KvCacheManager::cache_full_blocks(Sequence& seq) {
  if (!enable_prefix_caching_ || !seq.prefix_cache_open) return;
  const std::int32_t num_full = seq.num_computed_tokens / block_size_;
  for (std::int32_t i = seq.num_registered_blocks; i < num_full; ++i) {
    const BlockId parent = i == 0 ? kNoBlock : seq.block_table[i - 1];
    if (parent != kNoBlock && !cache_.contains(parent)) {
      seq.prefix_cache_open = false;  // its prefix was forgotten (forget_adapter)
      return;
    }
    const BlockId block = seq.block_table[i];
    const std::span<const TokenId> tokens(
        seq.tokens.data() + static_cast<std::size_t>(i) * block_size_,
        static_cast<std::size_t>(block_size_));
    const BlockId in_tree = cache_.insert(parent, tokens, block, seq.adapter);
    if (in_tree != block) {
      // Another sequence cached the same prefix first: this one keeps its own copy,
      // and its later blocks stay out (their parent in the tree is not ours to hold).
      seq.prefix_cache_open = false;
      return;
    }
    pool_.set_cached(block, true);
    seq.num_registered_blocks = i + 1;
  }
}

void KvCacheManager::release_blocks_after(Sequence& seq, std::int32_t num_tokens) {
  const auto keep = static_cast<std::size_t>(std::max(
      blocks_for(std::max(num_tokens, seq.num_computed_tokens)), seq.num_registered_blocks));
  while (seq.block_table.size() > keep) {
    pool_.unref(seq.block_table.back());
    seq.block_table.pop_back();
  }
}

void KvCacheManager::free(Sequence& seq) {
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) pool_.unref(*it);
  seq.block_table.clear();
  seq.num_registered_blocks = 0;
}

}  // namespace troupe::engine

namespace troupe::engine {

void KvCacheManager::clear_prefix_cache() {
  TROUPE_ASSERT(pool_.num_free() == pool_.num_blocks(), "clearing the cache while blocks are held");
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (!cache_.contains(b)) continue;
    removed_.clear();
    cache_.erase(b, removed_);
    for (BlockId r : removed_) pool_.set_cached(r, false);
  }
}

void KvCacheManager::forget_adapter(std::int32_t adapter) {
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (!cache_.contains(b) || !cache_.is_root_of(b, adapter)) continue;
    removed_.clear();
    cache_.erase(b, removed_);
    for (BlockId r : removed_) pool_.set_cached(r, false);
  }
}

}  // namespace troupe::engine
