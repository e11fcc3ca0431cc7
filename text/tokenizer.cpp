#include "text/tokenizer.hpp"

#include <algorithm>
#include <cstdio>

#include "text/bpe_encoder.hpp"

namespace troupe::text {

namespace {

constexpr std::string_view kSpmSpace = "\xe2\x96\x81";  // U+2581 '▁'

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  while (true) {
    const std::size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

// "<0x0A>" -> 10; anything else -> -1.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9')
      value += c - '0';
    else if (c >= 'A' && c <= 'F')
      value += c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      value += c - 'a' + 10;
    else
      return -1;
  }
  return value;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  TROUPE_TRY(auto vocab, Vocabulary::from_gguf(file));
  return from_vocabulary(std::move(vocab));
}

Result<Tokenizer> Tokenizer::from_vocabulary(Vocabulary vocabulary) {
  Tokenizer tok;
  // The BPE encoder keeps a pointer to the vocabulary: it must live at its final address first.
  tok.vocab_ = std::make_shared<const Vocabulary>(std::move(vocabulary));
  const Vocabulary& vocab = *tok.vocab_;
  const std::size_t n = vocab.size();
  tok.byte_tokens_.assign(256, kNoToken);
  tok.pieces_.resize(n);
  if (vocab.kind == VocabularyKind::bpe) {
    TROUPE_TRY(auto encoder, BpeEncoder::create(vocab));
    tok.bpe_ = std::make_shared<const BpeEncoder>(std::move(encoder));
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& text = vocab.tokens[i];
    const TokenType type = vocab.types[i];
    if (type == TokenType::control || type == TokenType::user_defined ||
        type == TokenType::unknown) {
      if (!text.empty()) tok.special_tokens_.push_back(static_cast<TokenId>(i));
    }
    if (vocab.kind == VocabularyKind::spm) {
      if (type == TokenType::byte) {
        const int byte = parse_byte_token(text);
        if (byte >= 0) {
          tok.pieces_[i] = std::string(1, static_cast<char>(byte));
          if (tok.byte_tokens_[byte] == kNoToken) tok.byte_tokens_[byte] = static_cast<TokenId>(i);
          continue;
        }
      }
      if (type == TokenType::unknown) {
        tok.pieces_[i] = "\xe2\x96\x85";  // as llama.cpp renders <unk>
        continue;
      }
      tok.pieces_[i] = replace_all(text, kSpmSpace, " ");
    } else {
      tok.pieces_[i] = (type == TokenType::normal || type == TokenType::byte)
                           ? tok.bpe_->decode_token_text(text)
                           : text;
    }
  }
  // SentencePiece spells what no piece covers byte by byte, with <unk> for a byte that has
  // no token: a vocabulary with neither could only encode to ids outside itself.
  if (vocab.kind == VocabularyKind::spm && vocab.unk == kNoToken) {
    const auto missing = std::find(tok.byte_tokens_.begin(), tok.byte_tokens_.end(), kNoToken);
    if (missing != tok.byte_tokens_.end()) {
      char byte[8];
      std::snprintf(byte, sizeof(byte), "0x%02X",
                    static_cast<unsigned>(missing - tok.byte_tokens_.begin()));
      return make_error(ErrorCode::invalid_file,
                        std::string("the SentencePiece vocabulary has no token for byte ") + byte +
                            " and no unknown token to stand for it");
    }
  }
  std::stable_sort(
      tok.special_tokens_.begin(), tok.special_tokens_.end(),
      [&](TokenId a, TokenId b) { return vocab.tokens[a].size() > vocab.tokens[b].size(); });
  return tok;
}

std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text,
                                                      bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back(Fragment{text, kNoToken});
  for (TokenId special : special_tokens_) {
    const TokenType type = vocab_->types[special];
    // Control and unknown tokens are plain text unless asked; user-defined ones always split.
    if (!parse_special && type != TokenType::user_defined) continue;
    const std::string& needle = vocab_->tokens[special];
    std::vector<Fragment> next;
    next.reserve(fragments.size());
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      std::size_t pos = 0;
      while (true) {
        const std::size_t hit = f.text.find(needle, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back(Fragment{f.text.substr(pos, hit - pos), kNoToken});
        next.push_back(Fragment{{}, special});
        pos = hit + needle.size();
      }
      if (pos < f.text.size()) next.push_back(Fragment{f.text.substr(pos), kNoToken});
    }
    fragments = std::move(next);
  }
  return fragments;
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<TokenId> out;
  if (add_special && vocab_->add_bos && vocab_->bos != kNoToken) out.push_back(vocab_->bos);
  bool previous_was_special = true;  // SPM: the first fragment gets the space prefix
  for (const Fragment& f : partition(text, parse_special)) {
    if (f.token != kNoToken) {
      out.push_back(f.token);
      previous_was_special = true;
      continue;
    }
    if (vocab_->kind == VocabularyKind::spm) {
      std::string prepared;
      if (vocab_->add_space_prefix && previous_was_special) prepared = " ";
      prepared.append(f.text);
      encode_spm(replace_all(prepared, " ", kSpmSpace), out);
    } else {
      encode_bpe(f.text, out);
    }
    previous_was_special = false;
  }
  if (add_special && vocab_->add_eos && vocab_->eos != kNoToken) out.push_back(vocab_->eos);
  return out;
}

void Tokenizer::encode_bpe(std::string_view text, std::vector<TokenId>& out) const {
  bpe_->encode(text, out);
}

std::string_view Tokenizer::piece(TokenId id, bool render_special) const {
  if (id < 0 || static_cast<std::size_t>(id) >= pieces_.size()) return {};
  const TokenType type = vocab_->types[id];
  if (type == TokenType::control || type == TokenType::unused) {
    return render_special ? std::string_view(vocab_->tokens[id]) : std::string_view();
  }
  return pieces_[id];
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool render_special) const {
  std::string out;
  for (TokenId id : ids) out.append(piece(id, render_special));
  return out;
}

}  // namespace troupe::text
