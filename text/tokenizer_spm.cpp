// SentencePiece encoding as llama.cpp does it: start from UTF-8 characters, and
// repeatedly merge the adjacent pair whose concatenation is the highest-scoring
// token (leftmost first on ties); what never forms a token falls back to bytes.
#include <queue>
#include <unordered_map>

#include "text/tokenizer.hpp"

namespace troupe::text {

namespace {

struct Symbol {
  int prev = -1;
  int next = -1;
  const char* text = nullptr;
  std::size_t size = 0;  // 0 once merged into its left neighbour
};

struct Bigram {
  int left = 0;
  int right = 0;
  float score = 0.0f;
  std::size_t size = 0;  // of the merged text: detects stale entries
};

struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class SpmSession {
 public:
  SpmSession(const Vocabulary& vocab, const std::vector<TokenId>& byte_tokens)
      : vocab_(vocab), byte_tokens_(byte_tokens) {}

  void encode(std::string_view text, std::vector<TokenId>& out) {
    for (std::size_t offset = 0; offset < text.size();) {
      Symbol s;
      s.text = text.data() + offset;
      s.size = utf8_char_length(text.substr(offset));
      s.prev = static_cast<int>(symbols_.size()) - 1;
      offset += s.size;
      s.next = offset == text.size() ? -1 : static_cast<int>(symbols_.size()) + 1;
      symbols_.push_back(s);
    }
    for (std::size_t i = 1; i < symbols_.size(); ++i) {
      try_add_bigram(static_cast<int>(i) - 1, static_cast<int>(i));
    }
    while (!queue_.empty()) {
      const Bigram bigram = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[bigram.left];
      Symbol& right = symbols_[bigram.right];
      if (left.size == 0 || right.size == 0 || left.size + right.size != bigram.size) continue;
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = bigram.left;
      try_add_bigram(left.prev, bigram.left);
      try_add_bigram(bigram.left, left.next);
    }
    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next) {
      resegment(symbols_[i], out);
    }
  }

 private:
  void try_add_bigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string text(symbols_[left].text, symbols_[left].size + symbols_[right].size);
    const TokenId id = vocab_.find(text);
    if (id == kNoToken) return;
    queue_.push(Bigram{left, right, vocab_.scores[id], text.size()});
    merges_[text] = {left, right};
  }

  // A symbol that is not a token is either a merge to undo or bytes to spell out.
  void resegment(const Symbol& symbol, std::vector<TokenId>& out) {
    const std::string text(symbol.text, symbol.size);
    const TokenId id = vocab_.find(text);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
    const auto merge = merges_.find(text);
    if (merge == merges_.end()) {
      for (char c : text) {
        const TokenId byte = byte_tokens_[static_cast<unsigned char>(c)];
        out.push_back(byte != kNoToken ? byte : vocab_.unk);
      }
      return;
    }
    resegment(symbols_[merge->second.first], out);
    resegment(symbols_[merge->second.second], out);
  }

  const Vocabulary& vocab_;
  const std::vector<TokenId>& byte_tokens_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
  std::unordered_map<std::string, std::pair<int, int>> merges_;
};

}  // namespace

void Tokenizer::encode_spm(std::string_view text, std::vector<TokenId>& out) const {
  SpmSession(*vocab_, byte_tokens_).encode(text, out);
}

}  // namespace troupe::text
