// Text to token ids and back, for the two vocabulary kinds GGUF models carry:
// SentencePiece (llama) and GPT-2 byte-level BPE. Matches llama.cpp's ids.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/vocabulary.hpp"
#include "troupe/result.hpp"
#include "troupe/types.hpp"

namespace troupe::text {

class BpeEncoder;

class Tokenizer {
 public:
  static Result<Tokenizer> from_gguf(const gguf::GgufFile& file);
  static Result<Tokenizer> from_vocabulary(Vocabulary vocab);

  // add_special: BOS/EOS as the vocabulary asks. parse_special: text such as
  // "<|im_end|>" becomes its control token instead of being spelled out.
  std::vector<TokenId> encode(std::string_view text, bool add_special,
                              bool parse_special = false) const;

  // The bytes a token stands for in generated text (control tokens: empty,
  // unless render_special). May be part of a UTF-8 sequence.
  std::string_view piece(TokenId id, bool render_special = false) const;
  std::string decode(std::span<const TokenId> ids, bool render_special = false) const;

  const Vocabulary& vocabulary() const { return *vocab_; }
  std::size_t size() const { return vocab_->size(); }

 private:
  struct Fragment {
    std::string_view text;     // raw text, when token == kNoToken
    TokenId token = kNoToken;  // a special token matched in the text
  };
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
  void encode_spm(std::string_view text, std::vector<TokenId>& out) const;
  void encode_bpe(std::string_view text, std::vector<TokenId>& out) const;

  std::shared_ptr<const Vocabulary> vocab_;
  std::vector<std::string> pieces_;      // what each token decodes to
  std::vector<TokenId> special_tokens_;  // split out of text, longest first
  std::vector<TokenId> byte_tokens_;     // [256] id of each byte, or kNoToken
  std::shared_ptr<const BpeEncoder> bpe_;
};

// Length of the UTF-8 character at the start of `text`: as llama.cpp counts it
// for valid text, but 1 for a byte that does not start a whole sequence, so
// invalid bytes stay apart instead of swallowing the characters after them.
inline std::size_t utf8_char_length(std::string_view text) {
  static constexpr std::size_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  const auto lead = static_cast<unsigned char>(text[0]);
  const std::size_t n = (lead & 0xF8) == 0xF8 ? 1 : kLengths[lead >> 4];
  if (n > text.size()) return 1;
  for (std::size_t i = 1; i < n; ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

}  // namespace troupe::text
