#include "grammar/regex.hpp"

#include <cctype>
#include <cstdio>

#include "grammar/gbnf.hpp"

namespace troupe::grammar {

namespace {

// A quantified group becomes two levels of GBNF parentheses ("((...))*"): groups nested
// this deep still make GBNF that parses.
constexpr int kMaxNesting = kMaxGbnfNesting / 2;

// A byte as a GBNF escape, for literals and classes alike.
std::string hex_escape(unsigned char c) {
  char buffer[8];
  std::snprintf(buffer, sizeof buffer, "\\x%02x", c);
  return buffer;
}

class RegexTranslator {
 public:
  explicit RegexTranslator(std::string_view regex) : re_(regex) {}

  Result<std::string> translate() {
    if (!re_.empty() && re_.front() == '^') re_.remove_prefix(1);
    if (!re_.empty() && re_.back() == '$' && !escaped_at(re_.size() - 1)) re_.remove_suffix(1);
    TROUPE_TRY(std::string body, alternatives(0));
    if (pos_ < re_.size()) return error("unbalanced ')'");
    return body.empty() ? std::string("\"\"") : body;
  }

 private:
  tl::unexpected<Error> error(const std::string& what) const {
    return make_error(ErrorCode::invalid_argument,
                      "regex at offset " + std::to_string(pos_) + ": " + what);
  }

  // Whether re_[i] is preceded by an odd number of backslashes.
  bool escaped_at(std::size_t i) const {
    std::size_t n = 0;
    while (i > n && re_[i - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }

  Result<std::string> alternatives(int depth) {
    if (depth > kMaxNesting) return error("groups nested too deep");
    std::string out;
    while (true) {
      TROUPE_TRY(std::string seq, sequence(depth));
      out += seq.empty() ? "\"\"" : seq;
      if (pos_ < re_.size() && re_[pos_] == '|') {
        ++pos_;
        out += " | ";
        continue;
      }
      return out;
    }
  }

  Result<std::string> sequence(int depth) {
    std::string out;
    while (pos_ < re_.size() && re_[pos_] != '|' && re_[pos_] != ')') {
      TROUPE_TRY(std::string atom, atom_at(depth));
      TROUPE_TRY(const std::string quantifier, quantifier_at());
      if (!out.empty()) out += ' ';
      out += quantifier.empty() ? atom : "(" + atom + ")" + quantifier;
    }
    return out;
  }

  Result<std::string> atom_at(int depth) {
    const char c = re_[pos_++];
    switch (c) {
      case '(': {
        if (pos_ < re_.size() && re_[pos_] == '?') {
          ++pos_;
          if (pos_ < re_.size() && re_[pos_] == ':') {
            ++pos_;
          } else if (pos_ + 1 < re_.size() && (re_[pos_] == 'P' || re_[pos_] == '<') &&
                     re_[pos_ + (re_[pos_] == 'P' ? 1 : 0)] == '<' &&
                     (re_[pos_] == 'P' || (re_[pos_ + 1] != '=' && re_[pos_ + 1] != '!'))) {
            while (pos_ < re_.size() && re_[pos_] != '>') ++pos_;  // a named group
            if (pos_ >= re_.size()) return error("unterminated group name");
            ++pos_;
          } else {
            return error("lookaround and inline flags are not supported");
          }
        }
        TROUPE_TRY(std::string inner, alternatives(depth + 1));
        if (pos_ >= re_.size() || re_[pos_] != ')') return error("missing ')'");
        ++pos_;
        return "(" + (inner.empty() ? std::string("\"\"") : inner) + ")";
      }
      case '[':
        return character_class();
      case '.':
        return std::string("[^\\n]");
      case '\\':
        return escape(false);
      case '^':
      case '$':
        return error("anchors are only allowed at the start and the end");
      case '*':
      case '+':
      case '?':
      case '{':
        --pos_;
        return error("nothing to repeat");
      default: {
        std::string text = literal_char(static_cast<unsigned char>(c));
        // A character beyond ASCII is one atom of all its UTF-8 bytes.
        while (static_cast<unsigned char>(c) >= 0xC0 && pos_ < re_.size() &&
               (static_cast<unsigned char>(re_[pos_]) & 0xC0) == 0x80) {
          text += re_[pos_++];
        }
        return "\"" + text + "\"";
      }
    }
  }

  static std::string literal_char(unsigned char c) {
    return std::isalnum(c) != 0 || c >= 0x80 ? std::string(1, static_cast<char>(c)) : hex_escape(c);
  }

  // After a backslash: a class shorthand, an escaped character, or a refusal. In a class,
  // a shorthand gives its ranges without brackets.
  Result<std::string> escape(bool in_class) {
    if (pos_ >= re_.size()) return error("a trailing backslash");
    const char e = re_[pos_++];
    switch (e) {
      case 'd':
        return std::string(in_class ? "0-9" : "[0-9]");
      case 'w':
        return std::string(in_class ? "a-zA-Z0-9_" : "[a-zA-Z0-9_]");
      case 's':
        return std::string(in_class ? " \\t\\n\\r\\x0b\\x0c" : "[ \\t\\n\\r\\x0b\\x0c]");
      case 'D':
      case 'W':
      case 'S':
        if (in_class) return error("a negated shorthand inside a class is not supported");
        return std::string(e == 'D'   ? "[^0-9]"
                           : e == 'W' ? "[^a-zA-Z0-9_]"
                                      : "[^ \\t\\n\\r\\x0b\\x0c]");
      case 'n':
        return in_class ? std::string("\\n") : std::string("\"\\n\"");
      case 't':
        return in_class ? std::string("\\t") : std::string("\"\\t\"");
      case 'r':
        return in_class ? std::string("\\r") : std::string("\"\\r\"");
      case 'f':
        return wrap(hex_escape(0x0c), in_class);
      case 'v':
        return wrap(hex_escape(0x0b), in_class);
      case 'x':
      case 'u': {
        const std::size_t digits = e == 'x' ? 2 : 4;
        if (pos_ + digits > re_.size()) return error("a short hex escape");
        const std::string hex(re_.substr(pos_, digits));
        for (const char h : hex) {
          if (std::isxdigit(static_cast<unsigned char>(h)) == 0) return error("a bad hex escape");
        }
        pos_ += digits;
        return wrap((e == 'x' ? "\\x" : "\\u") + hex, in_class);
      }
      case 'b':
      case 'B':
      case 'A':
      case 'Z':
      case 'z':
        return error("word boundaries and \\A \\Z anchors are not supported");
      default:
        if (std::isdigit(static_cast<unsigned char>(e)) != 0) {
          return error("backreferences are not supported");
        }
        if (std::isalnum(static_cast<unsigned char>(e)) != 0) {
          return error(std::string("unknown escape \\") + e);
        }
        return wrap(hex_escape(static_cast<unsigned char>(e)), in_class);
    }
  }

  static std::string wrap(const std::string& escaped, bool in_class) {
    return in_class ? escaped : "\"" + escaped + "\"";
  }

  Result<std::string> character_class() {
    std::string out = "[";
    if (pos_ < re_.size() && re_[pos_] == '^') {
      out += '^';
      ++pos_;
    }
    bool first = true;
    while (pos_ < re_.size() && (re_[pos_] != ']' || first)) {
      first = false;
      const char c = re_[pos_++];
      if (c == '\\') {
        TROUPE_TRY(const std::string part, escape(true));
        out += part;
      } else if (c == '-') {
        // A range's dash between two members, else a literal dash.
        const bool range = out.size() > 1 && out.back() != '[' && out.back() != '^' &&
                           pos_ < re_.size() && re_[pos_] != ']';
        out += range ? std::string("-") : hex_escape('-');
      } else if (c == '[' && pos_ < re_.size() && re_[pos_] == ':') {
        return error("POSIX classes [:name:] are not supported");
      } else {
        out += literal_char(static_cast<unsigned char>(c));
      }
    }
    if (pos_ >= re_.size()) return error("unterminated character class");
    ++pos_;
    return out + "]";
  }

  Result<std::string> quantifier_at() {
    if (pos_ >= re_.size()) return std::string();
    std::string q;
    const char c = re_[pos_];
    if (c == '*' || c == '+' || c == '?') {
      q = std::string(1, c);
      ++pos_;
    } else if (c == '{') {
      const std::size_t close = re_.find('}', pos_);
      if (close == std::string_view::npos) return error("unterminated {m,n}");
      const std::string_view inside = re_.substr(pos_ + 1, close - pos_ - 1);
      for (const char d : inside) {
        if (std::isdigit(static_cast<unsigned char>(d)) == 0 && d != ',') {
          return error("a bad {m,n} quantifier");
        }
      }
      if (inside.empty() || inside.front() == ',') return error("a {m,n} quantifier needs m");
      q = "{" + std::string(inside) + "}";
      pos_ = close + 1;
    } else {
      return std::string();
    }
    if (pos_ < re_.size() && (re_[pos_] == '?' || re_[pos_] == '+')) ++pos_;  // lazy, possessive
    if (pos_ < re_.size() &&
        (re_[pos_] == '*' || re_[pos_] == '+' || re_[pos_] == '?' || re_[pos_] == '{')) {
      return error("a quantifier after a quantifier");
    }
    return q;
  }

  std::string_view re_;
  std::size_t pos_ = 0;
};

}  // namespace

Result<std::string> regex_to_gbnf(std::string_view regex) {
  return RegexTranslator(regex).translate();
}

Result<Grammar> parse_regex(std::string_view regex) {
  TROUPE_TRY(const std::string body, regex_to_gbnf(regex));
  auto grammar = parse_gbnf("root ::= " + body + "\n");
  if (!grammar) {
    return make_error(ErrorCode::invalid_argument,
                      "regex '" + std::string(regex) + "': " + grammar.error().message);
  }
  return grammar;
}

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    out += std::isalnum(byte) != 0 || byte >= 0x80 || byte == ' ' ? std::string(1, c)
                                                                  : hex_escape(byte);
  }
  return out + "\"";
}

Result<Grammar> parse_choice(const std::vector<std::string>& choices) {
  if (choices.empty()) return make_error(ErrorCode::invalid_argument, "a choice of nothing");
  std::string body;
  for (const std::string& choice : choices) {
    if (!body.empty()) body += " | ";
    body += gbnf_literal(choice);
  }
  return parse_gbnf("root ::= " + body + "\n");
}

}  // namespace troupe::grammar
