// Which tokens a matcher allows next: every token whose bytes the grammar can take from the
// matcher's state. The vocabulary is sorted once per model, so that tokens sharing a prefix
// share the work of matching it, and a prefix the grammar rejects rejects every token that
// starts with it at once. As XGrammar does, a branch's top position is first walked alone:
// what it decides whatever lies below is kept by (grammar, position), and only the tokens
// it leaves undecided are walked on the whole stack. Each branch's mask is kept too, keyed
// by the grammar and the whole stack, so that a state met again (every character inside a
// string, every digit of a number, by any output of the same grammar) costs a lookup; any
// thread may call.
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
  // The work is spent from `budget`, if given: false, with `allowed` incomplete, once it
  // runs out (nothing incomplete is cached, so the same call fails the same way again).
  bool fill_mask(const Matcher& matcher, std::vector<std::uint64_t>& allowed,
                 WorkBudget* budget = nullptr) const;

  // Masks kept at most; past it the cache starts over.
  static constexpr std::size_t kMaxCachedMasks = 4096;
  std::size_t num_cached_masks() const;

 private:
  using Mask = std::vector<std::uint64_t>;
  // What a branch's top position decides whatever lies below it (XGrammar's split): the
  // tokens taken without leaving that position's rule, or by leaving it at their last
  // byte, are accepted; those that die before any branch left it are rejected; the rest,
  // which die after one did, depend on the rules below and stay uncertain.
  struct TopClass {
    Mask accepted;
    std::vector<std::int32_t> uncertain;  // in the sorted vocabulary's order
  };
  // Null where `budget` ran out.
  std::shared_ptr<const TopClass> classify(const Matcher& matcher, std::uint32_t top,
                                           WorkBudget* budget) const;
  // Walks `ids` (in the sorted vocabulary's order) from `stack`, setting the bits of the
  // tokens it takes; with `uncertain`, lists those it rejects after a branch left `stack`.
  // False where `budget` ran out.
  bool walk(const Matcher& matcher, const Matcher::Stack& stack,
            const std::vector<std::int32_t>& ids, Mask& allowed,
            std::vector<std::int32_t>* uncertain, WorkBudget* budget) const;

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
  mutable std::mutex mutex_;          // guards cache_ and classes_
  mutable std::unordered_map<Key, std::shared_ptr<const Mask>, KeyHash> cache_;
  // By (grammar, top position): a one-element stack as the key.
  mutable std::unordered_map<Key, std::shared_ptr<const TopClass>, KeyHash> classes_;
};

}  // namespace troupe::grammar
