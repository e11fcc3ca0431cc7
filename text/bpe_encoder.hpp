// GPT-2 byte-level BPE: pre-tokenizer splits (by tokenizer.ggml.pre), each
// word's bytes mapped to GPT-2's printable alphabet, then merges in rank order.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/pre_tokenizer.hpp"
#include "text/vocabulary.hpp"
#include "troupe/result.hpp"

namespace troupe::text {

class BpeEncoder {
 public:
  static Result<BpeEncoder> create(const Vocabulary& vocab);

  // Appends the ids of `text` (no special tokens inside) to out.
  void encode(std::string_view text, std::vector<TokenId>& out) const;
  // A token's text in the byte alphabet, back to raw bytes.
  std::string decode_token_text(std::string_view text) const;

 private:
  void encode_word(const std::string& word, std::vector<TokenId>& out) const;

  const Vocabulary* vocab_ = nullptr;
  PreTokenizer pre_ = PreTokenizer::gpt2;
  bool ignore_merges_ = false;  // llama-3: a word that is a token is taken whole
  std::unordered_map<std::string, std::int32_t> merge_ranks_;  // "left right" -> rank
  std::array<std::string, 256> byte_to_text_;                  // byte -> its UTF-8 letter
  std::unordered_map<char32_t, unsigned char> text_to_byte_;
};

}  // namespace troupe::text
