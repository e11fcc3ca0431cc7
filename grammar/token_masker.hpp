// Which tokens a matcher allows next: every token whose bytes the grammar can take from the
// matcher's state. The vocabulary is sorted once per model, so that tokens sharing a prefix
// share the work of matching it, and a prefix the grammar rejects rejects every token that
// starts with it at once.
#pragma once

#include <cstdint>
#include <string>
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
  // allowed: bit `id` set for every token the matcher can take next; [(vocab + 63) / 64].
  void fill_mask(const Matcher& matcher, std::vector<std::uint64_t>& allowed) const;

 private:
  std::vector<std::string> token_bytes_;
  std::vector<std::int32_t> sorted_;  // non-empty tokens' ids, in byte order of their bytes
};

}  // namespace troupe::grammar
