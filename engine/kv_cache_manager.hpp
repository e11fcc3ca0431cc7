// Capacity: which sequences can hold KV blocks, and which blocks. Owns the
// block pool and the prefix cache; the scheduler asks it for room and nothing
// else. Running out of blocks is an ordinary `false`, not an error.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/block_pool.hpp"
#include "engine/prefix_cache.hpp"
#include "engine/sequence.hpp"

namespace troupe::engine {

struct PrefixCacheStats {
  std::int64_t num_queried_tokens = 0;  // prompt tokens looked up on admission
  std::int64_t num_hit_tokens = 0;      // of those, found cached
  std::int64_t num_evicted_blocks = 0;
};

class KvCacheManager {
 public:
  KvCacheManager(std::int32_t num_blocks, std::int32_t block_size, bool enable_prefix_caching);

  std::int32_t block_size() const { return block_size_; }
  std::int32_t num_blocks() const { return pool_.num_blocks(); }
  std::int32_t num_free_blocks() const { return pool_.num_free(); }
  // Fraction of blocks held by sequences (cached free blocks count as free).
  double usage() const;
  const PrefixCacheStats& prefix_stats() const { return stats_; }
  const BlockPool& pool() const { return pool_; }
  const PrefixCache& prefix_cache() const { return cache_; }
  std::int32_t blocks_for(std::int32_t num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // For a sequence holding no blocks: its longest cached prefix, in whole blocks,
  // never all of its tokens (the last one must run to produce logits); none for a
  // sequence that scores its prompt (Sequence::scores_prompt).
  std::vector<BlockId> find_cached_prefix(const Sequence& seq) const;
  // How many of `prompt`'s tokens a new sequence would find cached (whole blocks, never
  // all of them), under LoRA adapter slot `adapter`: what a router compares across
  // replicas. Counts in no statistic.
  std::int32_t cached_prefix_tokens(std::span<const TokenId> prompt,
                                    std::int32_t adapter = 0) const;

  // Gives `seq` blocks for num_computed_tokens + num_new_tokens tokens. For a
  // sequence holding none, `cached_prefix` (from find_cached_prefix) is taken
  // first and counts as computed. All or nothing: false leaves `seq` as it was.
  bool allocate_slots(Sequence& seq, std::int32_t num_new_tokens,
                      std::span<const BlockId> cached_prefix = {});

  // After a step: the sequence's newly full blocks enter the prefix cache.
  void cache_full_blocks(Sequence& seq);

  // Returns the blocks of `seq` past those `num_tokens` tokens need (speculative
  // decoding's rejected tokens); never blocks its computed tokens lie in.
  void release_blocks_after(Sequence& seq, std::int32_t num_tokens);

  // Returns every block of `seq` (last first, so a prefix outlives its tails).
  void free(Sequence& seq);

  // Forgets every cached prefix (their KV memory is gone). Only when no block is held.
  void clear_prefix_cache();
  // Forgets the prefixes cached under LoRA adapter slot `adapter` (the slot holds another
  // adapter now). A sequence still holding such blocks keeps them, and caches no more.
  void forget_adapter(std::int32_t adapter);

 private:
  std::int32_t block_size_;
  bool enable_prefix_caching_;
  BlockPool pool_;
  PrefixCache cache_;
  PrefixCacheStats stats_;
  std::vector<BlockId> removed_;  // scratch for evictions
};

}  // namespace troupe::engine
