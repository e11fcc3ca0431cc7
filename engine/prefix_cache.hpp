// The prefix cache: a radix tree whose edges are full KV blocks. A node is one
// block; it is identified by its tokens and by its parent, so a path from the
// root spells a prefix. Requests that share a prefix (a system prompt, the
// earlier turns of a chat) share its blocks. Each LoRA adapter (by slot; 0 the base model)
// has a root of its own: keys and values computed under one adapter are never another's.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/sequence.hpp"

namespace troupe::engine {

class PrefixCache {
 public:
  PrefixCache(std::int32_t num_blocks, std::int32_t block_size);

  std::int32_t block_size() const { return block_size_; }
  std::size_t size() const { return num_nodes_; }
  bool contains(BlockId block) const { return nodes_[block].in_tree; }
  std::size_t num_children(BlockId block) const { return nodes_[block].children.size(); }
  // Whether `block` is in the tree right under `adapter`'s root.
  bool is_root_of(BlockId block, std::int32_t adapter) const {
    return nodes_[block].in_tree && nodes_[block].parent == kNoBlock &&
           nodes_[block].adapter == adapter;
  }

  // The blocks holding tokens[0 .. k * block_size), computed under `adapter`, for the
  // largest k <= max_blocks.
  std::vector<BlockId> match(std::span<const TokenId> tokens, std::int32_t max_blocks,
                             std::int32_t adapter = 0) const;

  // Enters `block`, holding `block_tokens`, as the child of `parent` (kNoBlock: the root of
  // `adapter`'s prefixes; below it, the parent's adapter is the block's). Returns the block
  // now in the tree for that prefix: `block`, or another one that already held the same
  // tokens (then `block` stays out).
  BlockId insert(BlockId parent, std::span<const TokenId> block_tokens, BlockId block,
                 std::int32_t adapter = 0);

  // Takes `block` out of the tree, with every block below it (appended to `removed`).
  void erase(BlockId block, std::vector<BlockId>& removed);

 private:
  struct TokensHash {
    using is_transparent = void;
    std::size_t operator()(std::span<const TokenId> tokens) const;
    std::size_t operator()(const std::vector<TokenId>& tokens) const {
      return (*this)(std::span<const TokenId>(tokens));
    }
  };
  struct TokensEqual {
    using is_transparent = void;
    bool operator()(std::span<const TokenId> a, std::span<const TokenId> b) const {
      return std::equal(a.begin(), a.end(), b.begin(), b.end());
    }
  };
  using Children = std::unordered_map<std::vector<TokenId>, BlockId, TokensHash, TokensEqual>;

  struct Node {
    bool in_tree = false;
    BlockId parent = kNoBlock;
    std::int32_t adapter = 0;  // whose root it is under (read where parent is kNoBlock)
    std::vector<TokenId> tokens;
    Children children;
  };

  Children& children_of(BlockId parent, std::int32_t adapter) {
    return parent == kNoBlock ? roots_[adapter] : nodes_[parent].children;
  }
  // Null where `adapter` has no root yet.
  const Children* children_of(BlockId parent, std::int32_t adapter) const {
    if (parent != kNoBlock) return &nodes_[parent].children;
    const auto it = roots_.find(adapter);
    return it == roots_.end() ? nullptr : &it->second;
  }

  std::int32_t block_size_;
  std::vector<Node> nodes_;                           // indexed by block id
  std::unordered_map<std::int32_t, Children> roots_;  // by adapter slot
  std::size_t num_nodes_ = 0;
};

}  // namespace troupe::engine
