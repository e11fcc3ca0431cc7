// Splits a Jinja template into text and the tokens inside its tags, applying the
// whitespace rules as Hugging Face sets jinja2 up for chat templates: `-` strips the
// whitespace next to a tag, trim_blocks drops the newline after a block or comment
// tag, lstrip_blocks drops the indentation before one, and the template's last
// newline goes (keep_trailing_newline=False). Comments are dropped here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/result.hpp"

namespace troupe::text::jinja {

enum class TokenKind {
  text,         // template text outside tags, whitespace rules applied
  print_begin,  // {{
  print_end,    // }}
  block_begin,  // {%
  block_end,    // %}
  name,
  string,  // its value unescaped
  integer,
  floating,
  op,   // punctuation and operators: + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { }
  end,  // the end of the template
};

struct Token {
  TokenKind kind = TokenKind::end;
  std::string text;
  std::int64_t integer = 0;
  double floating = 0.0;
  int line = 1;
  int column = 1;
};

// The tokens of `source`, ending with TokenKind::end; an error names its line and column.
Result<std::vector<Token>> lex(std::string_view source);

}  // namespace troupe::text::jinja
