// The KV block pool: reference counts and O(1) allocation. Free blocks are of
// two kinds: plain ones, handed out first, and ones still holding a cached
// prefix, kept in least-recently-freed order and evicted only when nothing
// plain is left.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/sequence.hpp"

namespace troupe::engine {

class BlockPool {
 public:
  explicit BlockPool(std::int32_t num_blocks);

  std::int32_t num_blocks() const { return static_cast<std::int32_t>(ref_counts_.size()); }
  // Blocks an allocation could get now: plain free plus evictable cached ones.
  std::int32_t num_free() const { return num_plain_free() + num_evictable_; }
  std::int32_t num_plain_free() const { return static_cast<std::int32_t>(plain_free_.size()); }
  std::int32_t num_evictable() const { return num_evictable_; }
  std::int32_t ref_count(BlockId block) const { return ref_counts_[block]; }
  bool is_cached(BlockId block) const { return cached_[block]; }

  // A block with one reference: plain if any, else the least recently freed cached
  // one, whose id is then reported through `evicted` so the cache can forget it.
  std::optional<BlockId> allocate(std::optional<BlockId>& evicted);
  // One more reference; a cached free block leaves the eviction order.
  void ref(BlockId block);
  // One reference less; at zero the block becomes free (evictable if cached).
  void unref(BlockId block);
  // Whether a block's content is findable in the prefix cache.
  void set_cached(BlockId block, bool cached);

 private:
  void lru_push_back(BlockId block);
  void lru_remove(BlockId block);

  std::vector<std::int32_t> ref_counts_;
  std::vector<bool> cached_;
  std::vector<BlockId> plain_free_;  // a stack: most recently freed on top
  // Intrusive doubly-linked list of evictable blocks, least recently freed first.
  std::vector<BlockId> prev_, next_;
  BlockId lru_head_ = kNoBlock, lru_tail_ = kNoBlock;
  std::int32_t num_evictable_ = 0;
};

}  // namespace troupe::engine
