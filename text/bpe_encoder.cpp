#include "text/bpe_encoder.hpp"

#include <queue>

#include "text/unicode.hpp"

namespace troupe::text {

namespace {

// One symbol of a word being merged: a run of the word's byte-alphabet text.
struct Symbol {
  int prev = -1;
  int next = -1;
  std::size_t offset = 0;
  std::size_t size = 0;  // 0 once merged into its left neighbour
};

struct Bigram {
  int left = 0;
  int right = 0;
  std::int32_t rank = 0;
  std::size_t size = 0;  // of the merged text: detects stale entries
};

struct BigramOrder {  // lowest rank first, then leftmost
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

Result<BpeEncoder> BpeEncoder::create(const Vocabulary& vocab) {
  BpeEncoder e;
  e.vocab_ = &vocab;
  TROUPE_TRY(e.pre_, pre_tokenizer_from_name(vocab.pre));
  e.ignore_merges_ = e.pre_ == PreTokenizer::llama3;
  e.merge_ranks_.reserve(vocab.merges.size());
  for (std::size_t i = 0; i < vocab.merges.size(); ++i) {
    const std::string& m = vocab.merges[i];
    const std::size_t space = m.find(' ', 1);
    if (space == std::string::npos || space + 1 >= m.size()) {
      return make_error(ErrorCode::invalid_file, "tokenizer.ggml.merges entry " +
                                                     std::to_string(i) +
                                                     " is not two symbols separated by a space");
    }
    e.merge_ranks_.emplace(m, static_cast<std::int32_t>(i));
  }
  // GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others
  // for the code points from 256 up, in byte order.
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
    append_utf8(e.byte_to_text_[b], cp);
    e.text_to_byte_[cp] = static_cast<unsigned char>(b);
  }
  return e;
}

std::string BpeEncoder::decode_token_text(std::string_view text) const {
  std::string out;
  for (const Utf8Char& c : decode_utf8(text)) {
    const auto it = text_to_byte_.find(c.cp);
    if (it != text_to_byte_.end()) {
      out += static_cast<char>(it->second);
    } else {
      out.append(text.substr(c.offset, c.length));  // not in the byte alphabet: keep as is
    }
  }
  return out;
}

void BpeEncoder::encode(std::string_view text, std::vector<TokenId>& out) const {
  std::string word;
  for (std::string_view w : pre_tokenize(pre_, text)) {
    word.clear();
    for (char c : w) word += byte_to_text_[static_cast<unsigned char>(c)];
    encode_word(word, out);
  }
}

void BpeEncoder::encode_word(const std::string& word, std::vector<TokenId>& out) const {
  if (ignore_merges_) {
    if (const TokenId id = vocab_->find(word); id != kNoToken) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> symbols;
  for (const Utf8Char& c : decode_utf8(word)) {
    Symbol s;
    s.offset = c.offset;
    s.size = c.length;
    s.prev = static_cast<int>(symbols.size()) - 1;
    s.next = static_cast<int>(symbols.size()) + 1;
    symbols.push_back(s);
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  std::string key;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    key.assign(word, l.offset, l.size);
    key += ' ';
    key.append(word, r.offset, r.size);
    const auto it = merge_ranks_.find(key);
    if (it != merge_ranks_.end()) queue.push(Bigram{left, right, it->second, l.size + r.size});
  };
  for (std::size_t i = 1; i < symbols.size(); ++i)
    try_add(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[b.left];
    Symbol& r = symbols[b.right];
    if (l.size == 0 || r.size == 0 || l.next != b.right || l.size + r.size != b.size) continue;
    l.size += r.size;
    r.size = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece(word.data() + symbols[i].offset, symbols[i].size);
    if (const TokenId id = vocab_->find(piece); id != kNoToken) {
      out.push_back(id);
      continue;
    }
    // Not a token: spell it out character by character (each one byte of the word).
    for (const Utf8Char& c : decode_utf8(piece)) {
      if (const TokenId id = vocab_->find(piece.substr(c.offset, c.length)); id != kNoToken) {
        out.push_back(id);
      }
    }
  }
}

}  // namespace troupe::text
