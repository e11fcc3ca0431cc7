#include "engine/prefix_cache.hpp"

#include <algorithm>

#include "troupe/result.hpp"

namespace troupe::engine {

std::size_t PrefixCache::TokensHash::operator()(std::span<const TokenId> tokens) const {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a over the ids
  for (TokenId t : tokens) {
    h ^= static_cast<std::uint32_t>(t);
    h *= 1099511628211ULL;
  }
  return static_cast<std::size_t>(h);
}

PrefixCache::PrefixCache(std::int32_t num_blocks, std::int32_t block_size)
    : block_size_(block_size), nodes_(num_blocks) {}

std::vector<BlockId> PrefixCache::match(std::span<const TokenId> tokens, std::int32_t max_blocks,
                                        std::int32_t adapter) const {
  std::vector<BlockId> blocks;
  BlockId parent = kNoBlock;
  const auto num_full = static_cast<std::int32_t>(tokens.size()) / block_size_;
  for (std::int32_t i = 0; i < std::min(num_full, max_blocks); ++i) {
    const Children* children = children_of(parent, adapter);
    if (children == nullptr) break;
    const auto it =
        children->find(tokens.subspan(static_cast<std::size_t>(i) * block_size_, block_size_));
    if (it == children->end()) break;
    parent = it->second;
    blocks.push_back(parent);
  }
  return blocks;
}

BlockId PrefixCache::insert(BlockId parent, std::span<const TokenId> block_tokens, BlockId block,
                            std::int32_t adapter) {
  TROUPE_ASSERT(static_cast<std::int32_t>(block_tokens.size()) == block_size_, "a partial block");
  TROUPE_ASSERT(parent == kNoBlock || nodes_[parent].in_tree,
                "inserting below a block not in the tree");
  TROUPE_ASSERT(!nodes_[block].in_tree, "a block cannot hold two prefixes");
  Children& children = children_of(parent, adapter);
  if (const auto it = children.find(block_tokens); it != children.end()) return it->second;
  Node& node = nodes_[block];
  node.in_tree = true;
  node.parent = parent;
  node.adapter = parent == kNoBlock ? adapter : nodes_[parent].adapter;
  node.tokens.assign(block_tokens.begin(), block_tokens.end());
  children.emplace(node.tokens, block);
  ++num_nodes_;
  return block;
}

void PrefixCache::erase(BlockId block, std::vector<BlockId>& removed) {
  TROUPE_ASSERT(nodes_[block].in_tree, "erasing a block that is not in the tree");
  children_of(nodes_[block].parent, nodes_[block].adapter).erase(nodes_[block].tokens);
  // Depth first over the subtree: every block below loses its prefix too.
  std::vector<BlockId> stack = {block};
  while (!stack.empty()) {
    const BlockId b = stack.back();
    stack.pop_back();
    Node& node = nodes_[b];
    for (const auto& [tokens, child] : node.children) stack.push_back(child);
    node = Node{};
    --num_nodes_;
    removed.push_back(b);
  }
}

}  // namespace troupe::engine
