#include "text/jinja/lexer.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>

#include "text/unicode.hpp"

namespace troupe::text::jinja {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// jinja2 reads "\r\n" and "\r" as "\n", and drops one trailing newline.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (std::size_t i = src_.find('\n'); i != std::string::npos; i = src_.find('\n', i + 1)) {
      line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> run() {
    bool line_starting = true;  // the last tag's end took the line's newline
    while (pos_ < src_.size()) {
      const std::size_t start = find_tag(pos_);
      std::string_view text(src_.data() + pos_, std::min(start, src_.size()) - pos_);
      if (start == std::string::npos) {
        emit_text(pos_, text);
        break;
      }
      const char kind = src_[start + 1];
      std::size_t p = start + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (sign != 0) ++p;
      text = strip_before_tag(text, sign, kind != '{', line_starting);
      emit_text(pos_, text);
      if (kind == '#') {
        const std::size_t close = src_.find("#}", p);
        if (close == std::string::npos) return error_at(start, "the comment is never closed");
        pos_ = close + 2;
        const char end_sign = close > p ? src_[close - 1] : 0;
        line_starting = after_tag(end_sign, true);
        continue;
      }
      push(kind == '{' ? TokenKind::print_begin : TokenKind::block_begin, start, "");
      pos_ = p;
      if (auto tag = lex_tag(kind == '{', start); !tag)
        return tl::unexpected(tag.error());
      else
        line_starting = *tag;
    }
    push(TokenKind::end, src_.size(), "");
    return std::move(tokens_);
  }

 private:
  std::size_t find_tag(std::size_t from) const {
    for (std::size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // `-` strips all whitespace before the tag; lstrip_blocks the indentation of a block
  // or comment tag that starts its line (unless `+`).
  static std::string_view strip_before_tag(std::string_view text, char sign, bool block_like,
                                           bool line_starting) {
    if (sign == '-') {
      while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
      return text;
    }
    if (sign == '+' || !block_like) return text;
    const std::size_t newline = text.rfind('\n');
    const std::size_t line_start = newline == std::string_view::npos ? 0 : newline + 1;
    if (line_start == 0 && !line_starting) return text;
    const auto rest = text.substr(line_start);
    if (!rest.empty() && std::all_of(rest.begin(), rest.end(), is_space)) {
      return text.substr(0, line_start);
    }
    return text;
  }

  // After a tag's end: `-` strips the whitespace that follows; trim_blocks drops one
  // newline after a block or comment (unless `+`). Returns whether that ended a line.
  bool after_tag(char end_sign, bool block_like) {
    if (end_sign == '-') {
      const std::size_t from = pos_;
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      return pos_ > from && src_[pos_ - 1] == '\n';
    }
    if (block_like && end_sign != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      return true;
    }
    return false;
  }

  // The tokens of one {{ }} or {% %} tag; returns whether its end took a newline.
  Result<bool> lex_tag(bool print, std::size_t tag_start) {
    int depth = 0;  // open brackets: "}}" inside a dict literal does not end the tag
    const std::string_view close = print ? "}}" : "%}";
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        return error_at(tag_start,
                        std::string("the tag is never closed with '") + std::string(close) + "'");
      }
      if (depth == 0) {
        const std::string_view rest(src_.data() + pos_, src_.size() - pos_);
        char sign = 0;
        std::size_t len = 0;
        if (rest.starts_with(close)) {
          len = 2;
        } else if ((rest[0] == '-' || (!print && rest[0] == '+')) &&
                   rest.substr(1).starts_with(close)) {
          sign = rest[0];
          len = 3;
        }
        if (len > 0) {
          push(print ? TokenKind::print_end : TokenKind::block_end, pos_, "");
          pos_ += len;
          return after_tag(sign, !print);
        }
      }
      if (auto t = lex_token(depth); !t) return tl::unexpected(t.error());
    }
  }

  Result<bool> lex_token(int& depth) {
    const std::size_t start = pos_;
    const char c = src_[pos_];
    if (is_name_start(c)) {
      while (pos_ < src_.size() && (is_name_start(src_[pos_]) || is_digit(src_[pos_]))) ++pos_;
      push(TokenKind::name, start, src_.substr(start, pos_ - start));
      return true;
    }
    if (is_digit(c)) return lex_number();
    if (c == '\'' || c == '"') return lex_string();
    static constexpr std::array<std::string_view, 9> kLong = {"//", "**", "==", "!=", "<=", ">="};
    for (const auto op : kLong) {
      if (!op.empty() && std::string_view(src_).substr(pos_).starts_with(op)) {
        push(TokenKind::op, start, std::string(op));
        pos_ += op.size();
        return true;
      }
    }
    if (std::string_view("+-*/%~<>=.,:|()[]{}").find(c) == std::string_view::npos) {
      return error_at(start, std::string("unexpected character '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
    push(TokenKind::op, start, std::string(1, c));
    ++pos_;
    return true;
  }

  Result<bool> lex_number() {
    const std::size_t start = pos_;
    while (pos_ < src_.size() && is_digit(src_[pos_])) ++pos_;
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      is_float = true;
      ++pos_;
      while (pos_ < src_.size() && is_digit(src_[pos_])) ++pos_;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      std::size_t q = pos_ + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        is_float = true;
        pos_ = q;
        while (pos_ < src_.size() && is_digit(src_[pos_])) ++pos_;
      }
    }
    const std::string text = src_.substr(start, pos_ - start);
    Token& t = push(is_float ? TokenKind::floating : TokenKind::integer, start, text);
    if (is_float) {
      t.floating = std::strtod(text.c_str(), nullptr);
    } else if (std::from_chars(text.data(), text.data() + text.size(), t.integer).ec !=
               std::errc{}) {
      return error_at(start, "the integer " + text + " is too large");
    }
    return true;
  }

  // A quoted string with Python's escapes (\n, \t, \\, \', \", \xNN, \uNNNN, ...).
  Result<bool> lex_string() {
    const std::size_t start = pos_;
    const char quote = src_[pos_++];
    std::string value;
    while (true) {
      if (pos_ >= src_.size()) return error_at(start, "the string is never closed");
      const char c = src_[pos_++];
      if (c == quote) break;
      if (c != '\\' || pos_ >= src_.size()) {
        value += c;
        continue;
      }
      const char e = src_[pos_++];
      const std::size_t hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
      if (hex > 0) {
        std::uint32_t cp = 0;
        const auto digits = std::string_view(src_).substr(pos_, hex);
        if (digits.size() != hex ||
            std::from_chars(digits.data(), digits.data() + hex, cp, 16).ptr !=
                digits.data() + hex ||
            cp > 0x10FFFF) {
          return error_at(pos_ - 2, "a malformed \\" + std::string(1, e) + " escape");
        }
        text::append_utf8(value, static_cast<char32_t>(cp));
        pos_ += hex;
        continue;
      }
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '0':
          value += '\0';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        case '\n':
          break;  // a line continuation
        default:
          value += '\\';
          value += e;  // Python keeps unknown escapes
      }
    }
    push(TokenKind::string, start, std::move(value));
    return true;
  }

  Token& push(TokenKind kind, std::size_t offset, std::string text) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    locate(offset, t.line, t.column);
    tokens_.push_back(std::move(t));
    return tokens_.back();
  }

  void emit_text(std::size_t offset, std::string_view text) {
    if (!text.empty()) push(TokenKind::text, offset, std::string(text));
  }

  void locate(std::size_t offset, int& line, int& column) const {
    const auto next = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    line = static_cast<int>(next - line_starts_.begin());
    column = static_cast<int>(offset - *(next - 1)) + 1;
  }

  tl::unexpected<Error> error_at(std::size_t offset, const std::string& what) const {
    int line = 0, column = 0;
    locate(offset, line, column);
    return make_error(ErrorCode::invalid_argument, "chat template syntax error at line " +
                                                       std::to_string(line) + ", column " +
                                                       std::to_string(column) + ": " + what);
  }

  std::string src_;
  std::vector<std::size_t> line_starts_;  // offset of each line's first character
  std::size_t pos_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> lex(std::string_view source) {
  return Lexer(normalize_newlines(source)).run();
}

}  // namespace troupe::text::jinja
