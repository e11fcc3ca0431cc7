// A model's vocabulary as GGUF metadata describes it: token texts, scores,
// types and the special ids. The tokenizers read it; they never change it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/gguf_file.hpp"
#include "troupe/result.hpp"
#include "troupe/types.hpp"

namespace troupe::text {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class TokenType : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

enum class VocabularyKind {
  spm,  // SentencePiece (tokenizer.ggml.model = "llama")
  bpe,  // GPT-2 byte-level BPE (tokenizer.ggml.model = "gpt2")
};

struct Vocabulary {
  VocabularyKind kind = VocabularyKind::spm;
  std::string pre;  // tokenizer.ggml.pre: the BPE pre-tokenizer's name
  std::vector<std::string> tokens;
  std::vector<float> scores;  // SPM merge priorities; empty for BPE
  std::vector<TokenType> types;
  std::vector<std::string> merges;  // BPE merges "left right", in rank order
  std::unordered_map<std::string, TokenId> token_ids;

  TokenId bos = kNoToken;
  TokenId eos = kNoToken;
  TokenId eot = kNoToken;  // end of turn, where the model has one
  TokenId unk = kNoToken;
  TokenId pad = kNoToken;
  // Fill-in-the-middle: prefix, suffix and middle markers (all three, or none usable).
  TokenId fim_pre = kNoToken;
  TokenId fim_suf = kNoToken;
  TokenId fim_mid = kNoToken;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = true;
  std::vector<TokenId> end_of_generation;  // eos, eot and the like: generation stops

  static Result<Vocabulary> from_gguf(const gguf::GgufFile& file);

  std::size_t size() const { return tokens.size(); }
  TokenId find(std::string_view text) const {
    const auto it = token_ids.find(std::string(text));
    return it == token_ids.end() ? kNoToken : it->second;
  }
  bool is_end_of_generation(TokenId id) const;
  bool has_fill_in_the_middle() const {
    return fim_pre != kNoToken && fim_suf != kNoToken && fim_mid != kNoToken;
  }
};

}  // namespace troupe::text
