// GPT-2 byte-level BPE: pre-tokenizer splits (by tokenizer.ggml.pre), then
// rank-ordered merges over the byte-to-unicode alphabet.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "model/vocabulary.hpp"
#include "troupe/result.hpp"

namespace troupe::model {

class BpeEncoder {
 public:
  static Result<BpeEncoder> create(const Vocabulary& vocab);
  void encode(std::string_view text, std::vector<TokenId>& out) const;
  // A token's text in the byte-to-unicode alphabet, back to raw bytes.
  std::string decode_token_text(std::string_view text) const;
};

}  // namespace troupe::model
