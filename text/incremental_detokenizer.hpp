// Turns a stream of token ids into text pieces that never end inside a UTF-8
// sequence: bytes of an unfinished character wait for the next token. The
// concatenation of every piece and flush() is exactly the decoded text.
#pragma once

#include <string>

#include "text/tokenizer.hpp"

namespace troupe::text {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // The text that became complete with this token (possibly empty); a control token's text
  // shows only when `render_special`.
  std::string push(TokenId id, bool render_special = false);
  // Whatever is still held (an unfinished sequence), at the end of the stream.
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;
};

// How many bytes at the end of `text` begin a UTF-8 sequence that is not yet
// complete (0 when the text ends on a boundary or with invalid bytes).
std::size_t incomplete_utf8_suffix(std::string_view text);

}  // namespace troupe::text
