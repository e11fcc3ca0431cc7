#include "engine/block_pool.hpp"

#include "troupe/result.hpp"

namespace troupe::engine {

BlockPool::BlockPool(std::int32_t num_blocks)
    : ref_counts_(num_blocks, 0),
      cached_(num_blocks, false),
      prev_(num_blocks, kNoBlock),
      next_(num_blocks, kNoBlock) {
  plain_free_.reserve(num_blocks);
  // Low ids on top, so a fresh pool hands out 0, 1, 2, ...
  for (BlockId b = num_blocks - 1; b >= 0; --b) plain_free_.push_back(b);
}

std::optional<BlockId> BlockPool::allocate(std::optional<BlockId>& evicted) {
  evicted.reset();
  BlockId block;
  if (!plain_free_.empty()) {
    block = plain_free_.back();
    plain_free_.pop_back();
  } else if (lru_head_ != kNoBlock) {
    block = lru_head_;
    lru_remove(block);
    cached_[block] = false;
    evicted = block;
  } else {
    return std::nullopt;
  }
  TROUPE_ASSERT(ref_counts_[block] == 0, "allocating a referenced block");
  ref_counts_[block] = 1;
  return block;
}

void BlockPool::ref(BlockId block) {
  if (ref_counts_[block] == 0) {
    TROUPE_ASSERT(cached_[block], "only cached free blocks can be taken by reference");
    lru_remove(block);
  }
  ++ref_counts_[block];
}

void BlockPool::unref(BlockId block) {
  TROUPE_ASSERT(ref_counts_[block] > 0, "freeing a block twice");
  if (--ref_counts_[block] > 0) return;
  if (cached_[block])
    lru_push_back(block);
  else
    plain_free_.push_back(block);
}

void BlockPool::set_cached(BlockId block, bool cached) {
  if (cached_[block] == cached) return;
  if (ref_counts_[block] == 0) {
    // A free block can only leave the cache: it moves from the eviction order to plain.
    TROUPE_ASSERT(!cached, "only a block in use can enter the cache");
    lru_remove(block);
    plain_free_.push_back(block);
  }
  cached_[block] = cached;
}

void BlockPool::lru_push_back(BlockId block) {
  prev_[block] = lru_tail_;
  next_[block] = kNoBlock;
  if (lru_tail_ != kNoBlock)
    next_[lru_tail_] = block;
  else
    lru_head_ = block;
  lru_tail_ = block;
  ++num_evictable_;
}

void BlockPool::lru_remove(BlockId block) {
  if (prev_[block] != kNoBlock)
    next_[prev_[block]] = next_[block];
  else
    lru_head_ = next_[block];
  if (next_[block] != kNoBlock)
    prev_[next_[block]] = prev_[block];
  else
    lru_tail_ = prev_[block];
  prev_[block] = next_[block] = kNoBlock;
  --num_evictable_;
}

}  // namespace troupe::engine
