// Which tokens a matcher allows next: every token whose bytes the grammar can take from the
// matcher's state. The vocabulary is sorted once per model, so that tokens sharing a prefix
// share the work of matching it, and a prefix the grammar rejects rejects every token that
// starts with it at once. Each branch's mask is kept, keyed by the grammar and the branch's
// whole stack, so that a state met again (every character inside a string, every digit of a
// number, by any output of the same grammar) costs a lookup; any thread may call.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.hpp"

namespace troupe::grammar {

class TokenMasker {
 public:
  // token_bytes[id]: what token `id` stands for, as bytes; empty for a token no grammar
  // produces (control and special tokens: the caller allows end-of-sequence tokens itself
  // where Matcher::can_end()).
  explicit TokenMasker(std::vector<std::string> token_bytes);

  std::int32_t vocab_size() const { return static_cast<std::int32_t>(token_bytes_.size()); }
  // What token `id` stands for (empty for a control token).
  std::string_view token_bytes(std::int32_t id) const { return token_bytes_[id]; }
  // allowed: bit `id` set for every token the matcher can take next; [(vocab + 63) / 64].
  void fill_mask(const Matcher& matcher, std::vector<std::uint64_t>& allowed) const;

  // Masks kept at most; past it the cache starts over.
  static constexpr std::size_t kMaxCachedMasks = 4096;
  std::size_t num_cached_masks() const;

 private:
  using Mask = std::vector<std::uint64_t>;
  // The tokens one branch allows, by walking the sorted vocabulary.
  void walk(const Matcher& matcher, const Matcher::Stack& stack, Mask& allowed) const;

  struct Key {
    std::uint64_t grammar;
    Matcher::Stack stack;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& key) const;
  };

  std::vector<std::string> token_bytes_;
  std::vector<std::int32_t> sorted_;  // non-empty tokens' ids, in byte order of their bytes
  mutable std::mutex mutex_;          // guards cache_
  mutable std::unordered_map<Key, std::shared_ptr<const Mask>, KeyHash> cache_;
};

}  // namespace troupe::grammar
