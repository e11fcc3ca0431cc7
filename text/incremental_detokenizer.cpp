#include "text/incremental_detokenizer.hpp"

namespace troupe::text {

std::size_t incomplete_utf8_suffix(std::string_view text) {
  // Walk back over at most three continuation bytes to the lead byte.
  const std::size_t n = text.size();
  for (std::size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto byte = static_cast<unsigned char>(text[n - back]);
    if ((byte & 0xC0) == 0x80) continue;  // continuation byte
    std::size_t needed = 0;
    if ((byte & 0xE0) == 0xC0)
      needed = 2;
    else if ((byte & 0xF0) == 0xE0)
      needed = 3;
    else if ((byte & 0xF8) == 0xF0)
      needed = 4;
    return needed > back ? back : 0;
  }
  return 0;
}

std::string IncrementalDetokenizer::push(TokenId id, bool render_special) {
  pending_.append(tokenizer_->piece(id, render_special));
  const std::size_t hold = incomplete_utf8_suffix(pending_);
  std::string ready = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return ready;
}

std::string IncrementalDetokenizer::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace troupe::text
