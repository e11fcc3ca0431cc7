#include "grammar/gbnf.hpp"

#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "grammar/utf8_ranges.hpp"

namespace troupe::grammar {

namespace {

constexpr int kMaxNesting = kMaxGbnfNesting;   // parentheses deep
constexpr std::uint32_t kMaxRepeat = 4096;     // the largest bound of {m,n}
constexpr std::size_t kMaxElements = 1 << 20;  // elements repetitions may write, in all

bool is_surrogate(std::uint32_t c) {
  return c >= 0xD800 && c <= 0xDFFF;
}

std::string hex4(std::uint32_t c) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  for (int shift = 12; shift >= 0; shift -= 4) out += kDigits[(c >> shift) & 0xF];
  return out;
}

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_';
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<Grammar> parse() {
    skip_space(true);
    std::set<std::string> defined;
    while (pos_ < text_.size()) {
      const std::string name = parse_name();
      if (name.empty()) return error("expected a rule name");
      if (!defined.insert(name).second) return error("rule '" + name + "' is defined twice");
      skip_space(false);
      if (text_.substr(pos_, 3) != "::=") return error("expected '::=' after '" + name + "'");
      pos_ += 3;
      const std::uint32_t rule = grammar_.rule_index(name);
      TROUPE_TRY(auto alternatives, parse_alternatives(name, 0));
      grammar_.rules[rule].alternatives = std::move(alternatives);
      skip_space(false);
      if (pos_ < text_.size() && text_[pos_] != '\n' && text_[pos_] != '\r') {
        return error("expected the end of the line after rule '" + name + "'");
      }
      skip_space(true);
    }
    if (!defined.contains("root")) {
      return make_error(ErrorCode::invalid_argument, "the grammar has no 'root' rule");
    }
    grammar_.root = grammar_.rule_index("root");
    for (const Rule& rule : grammar_.rules) {
      if (rule.alternatives.empty() && !defined.contains(rule.name)) {
        return make_error(ErrorCode::invalid_argument,
                          "rule '" + rule.name + "' is used but never defined");
      }
    }
    return std::move(grammar_);
  }

 private:
  tl::unexpected<Error> error(const std::string& what) const {
    int line = 1, column = 1;
    for (std::size_t i = 0; i < std::min(pos_, text_.size()); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return make_error(ErrorCode::invalid_argument, "grammar " + std::to_string(line) + ":" +
                                                       std::to_string(column) + ": " + what);
  }

  // Spaces and comments; newlines too where `newlines` (inside parentheses, after '|').
  void skip_space(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const std::size_t start = pos_;
    while (pos_ < text_.size() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  std::string made_up_name(const std::string& base) {
    return base + "~" + std::to_string(++num_made_up_);  // '~' is not a name character
  }

  Result<std::vector<Alternative>> parse_alternatives(const std::string& rule, int depth) {
    if (depth > kMaxNesting) return error("parentheses nested too deep");
    std::vector<Alternative> alternatives;
    while (true) {
      Alternative alt;
      TROUPE_TRY_VOID(parse_sequence(rule, depth, alt));
      alternatives.push_back(std::move(alt));
      skip_space(depth > 0);
      if (pos_ < text_.size() && text_[pos_] == '|') {
        ++pos_;
        skip_space(true);
        continue;
      }
      return alternatives;
    }
  }

  Result<void> parse_sequence(const std::string& rule, int depth, Alternative& alt) {
    while (true) {
      skip_space(depth > 0);
      if (pos_ >= text_.size()) return {};
      const char c = text_[pos_];
      const std::size_t start = alt.size();  // where the last item's elements begin
      if (c == '"') {
        ++pos_;
        while (pos_ < text_.size() && text_[pos_] != '"') {
          TROUPE_TRY(const std::uint32_t code_point, parse_char());
          for (const char byte : utf8_encode(code_point)) {
            ByteSet set;
            set.set(static_cast<std::uint8_t>(byte));
            alt.push_back(bytes(set));
          }
        }
        if (pos_ >= text_.size()) return error("unterminated string");
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        TROUPE_TRY(const Element e, parse_class(rule));
        alt.push_back(e);
      } else if (c == '.') {
        ++pos_;
        alt.push_back(code_point_ranges(rule, {{0, 0x10FFFF}}));
      } else if (c == '(') {
        ++pos_;
        skip_space(true);
        const std::string name = made_up_name(rule);
        TROUPE_TRY(auto alternatives, parse_alternatives(rule, depth + 1));
        if (pos_ >= text_.size() || text_[pos_] != ')') return error("expected ')'");
        ++pos_;
        alt.push_back(rule_element(name, std::move(alternatives)));
      } else if (is_name_char(c)) {
        const std::string name = parse_name();
        alt.push_back(Element{Element::Kind::rule, grammar_.rule_index(name)});
      } else {
        return {};  // '|', ')', a newline or the end: the caller decides
      }
      TROUPE_TRY_VOID(parse_repetitions(rule, alt, start));
    }
  }

  // Postfix * + ? {m,n} on the item at alt[start..].
  Result<void> parse_repetitions(const std::string& rule, Alternative& alt, std::size_t start) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != '*' && c != '+' && c != '?' && c != '{') return {};
      if (alt.size() == start) return error("nothing to repeat");
      ++pos_;
      std::uint32_t min = 0, max = 0;
      bool unbounded = false;
      if (c == '*') {
        unbounded = true;
      } else if (c == '+') {
        min = 1;
        unbounded = true;
      } else if (c == '?') {
        max = 1;
      } else {
        TROUPE_TRY(min, parse_number());
        max = min;
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          if (pos_ < text_.size() && text_[pos_] == '}') {
            unbounded = true;
          } else {
            TROUPE_TRY(max, parse_number());
          }
        }
        if (pos_ >= text_.size() || text_[pos_] != '}') return error("expected '}'");
        ++pos_;
        if (!unbounded && max < min) return error("a repetition's maximum is below its minimum");
      }
      const Alternative item(alt.begin() + static_cast<std::ptrdiff_t>(start), alt.end());
      num_repeated_ += item.size() * (std::max(min, max) + 1);
      if (num_repeated_ > kMaxElements) return error("the repetitions make the grammar too large");
      alt.resize(start);
      for (std::uint32_t i = 0; i < min; ++i) alt.insert(alt.end(), item.begin(), item.end());
      if (unbounded) {
        // R ::= item R | (nothing)
        const std::uint32_t r = grammar_.rule_index(made_up_name(rule));
        Alternative again = item;
        again.push_back(Element{Element::Kind::rule, r});
        grammar_.rules[r].alternatives = {std::move(again), {}};
        alt.push_back(Element{Element::Kind::rule, r});
      } else if (max > min) {
        // O1 ::= item | (nothing); Ok ::= item O(k-1) | (nothing)
        std::uint32_t inner = 0;
        for (std::uint32_t k = 1; k <= max - min; ++k) {
          const std::uint32_t r = grammar_.rule_index(made_up_name(rule));
          Alternative once = item;
          if (k > 1) once.push_back(Element{Element::Kind::rule, inner});
          grammar_.rules[r].alternatives = {std::move(once), {}};
          inner = r;
        }
        alt.push_back(Element{Element::Kind::rule, inner});
      }
    }
    return {};
  }

  Result<std::uint32_t> parse_number() {
    const std::size_t start = pos_;
    std::uint64_t value = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])) != 0) {
      value = value * 10 + static_cast<std::uint64_t>(text_[pos_] - '0');
      if (value > kMaxRepeat) return error("repetition bound above " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    if (pos_ == start) return error("expected a number");
    return static_cast<std::uint32_t>(value);
  }

  // One character of a literal or class, with its escape; UTF-8 decoded.
  Result<std::uint32_t> parse_char() {
    if (pos_ >= text_.size()) return error("unexpected end of the grammar");
    const auto byte = static_cast<unsigned char>(text_[pos_]);
    if (byte == '\\') {
      if (++pos_ >= text_.size()) return error("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case 'n':
          return std::uint32_t{'\n'};
        case 'r':
          return std::uint32_t{'\r'};
        case 't':
          return std::uint32_t{'\t'};
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<std::uint32_t>(e);
        default:
          --pos_;
          return error(std::string("unknown escape '\\") + e + "'");
      }
    }
    // A UTF-8 sequence as written in the grammar.
    const int length = byte < 0x80         ? 1
                       : byte >> 5 == 0x6  ? 2
                       : byte >> 4 == 0xE  ? 3
                       : byte >> 3 == 0x1E ? 4
                                           : 0;
    if (length == 0 || pos_ + length > text_.size()) return error("invalid UTF-8");
    std::uint32_t c = length == 1 ? byte : byte & (0xFF >> (length + 1));
    for (int i = 1; i < length; ++i) {
      const auto next = static_cast<unsigned char>(text_[pos_ + i]);
      if ((next & 0xC0) != 0x80) return error("invalid UTF-8");
      c = (c << 6) | (next & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    constexpr std::uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < kSmallest[length] || c > 0x10FFFF || is_surrogate(c)) return error("invalid UTF-8");
    pos_ += static_cast<std::size_t>(length);
    return c;
  }

  Result<std::uint32_t> parse_hex(int digits) {
    std::uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= text_.size() || std::isxdigit(static_cast<unsigned char>(text_[pos_])) == 0) {
        return error("expected " + std::to_string(digits) + " hex digits");
      }
      const char h = static_cast<char>(std::tolower(static_cast<unsigned char>(text_[pos_++])));
      value = value * 16 + static_cast<std::uint32_t>(h <= '9' ? h - '0' : h - 'a' + 10);
    }
    if (value > 0x10FFFF) return error("code point beyond U+10FFFF");
    // A UTF-16 surrogate (\uD800 alone, or half of a pair written as two escapes) is not a
    // character: no UTF-8 text holds one, so a grammar that asks for it is refused.
    if (is_surrogate(value)) {
      pos_ -= static_cast<std::size_t>(digits);
      return error("U+" + hex4(value) + " is a UTF-16 surrogate, not a character (write U+" +
                   "10000 and above as \\U00XXXXXX or as UTF-8)");
    }
    return value;
  }

  // [...] or [^...], after the '['.
  Result<Element> parse_class(const std::string& rule) {
    const bool negated = pos_ < text_.size() && text_[pos_] == '^';
    if (negated) ++pos_;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;
    while (pos_ < text_.size() && text_[pos_] != ']') {
      TROUPE_TRY(const std::uint32_t lo, parse_char());
      std::uint32_t hi = lo;
      if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
        ++pos_;
        TROUPE_TRY(hi, parse_char());
        if (hi < lo) return error("a character range runs backwards");
      }
      ranges.emplace_back(lo, hi);
    }
    if (pos_ >= text_.size()) return error("unterminated character class");
    ++pos_;
    std::sort(ranges.begin(), ranges.end());
    if (negated) {  // the complement over all code points
      std::vector<std::pair<std::uint32_t, std::uint32_t>> complement;
      std::uint32_t next = 0;
      for (const auto& [lo, hi] : ranges) {
        if (lo > next) complement.emplace_back(next, lo - 1);
        next = std::max(next, hi + 1);
      }
      if (next <= 0x10FFFF) complement.emplace_back(next, 0x10FFFF);
      ranges = std::move(complement);
    }
    if (ranges.empty()) return error("a character class that matches nothing");
    return code_point_ranges(rule, ranges);
  }

  // One element matching any code point of `ranges`: a byte set when all are ASCII, else a
  // made-up rule of their UTF-8 byte sequences.
  Element code_point_ranges(const std::string& rule,
                            const std::vector<std::pair<std::uint32_t, std::uint32_t>>& ranges) {
    ByteSet ascii;
    std::vector<Alternative> multibyte;
    for (const auto& [lo, hi] : ranges) {
      for (const auto& sequence : utf8_sequences(lo, hi)) {
        if (sequence.size() == 1) {
          for (int b = sequence[0].first; b <= sequence[0].second; ++b) ascii.set(b);
          continue;
        }
        Alternative alt;
        for (const auto& [first, last] : sequence) {
          ByteSet set;
          for (int b = first; b <= last; ++b) set.set(b);
          alt.push_back(bytes(set));
        }
        multibyte.push_back(std::move(alt));
      }
    }
    if (multibyte.empty()) return bytes(ascii);
    if (ascii.any()) multibyte.insert(multibyte.begin(), Alternative{bytes(ascii)});
    return rule_element(made_up_name(rule), std::move(multibyte));
  }

  Element bytes(const ByteSet& set) {
    return Element{Element::Kind::bytes, grammar_.byte_set_index(set)};
  }

  Element rule_element(const std::string& name, std::vector<Alternative> alternatives) {
    const std::uint32_t r = grammar_.rule_index(name);
    grammar_.rules[r].alternatives = std::move(alternatives);
    return Element{Element::Kind::rule, r};
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  Grammar grammar_;
  int num_made_up_ = 0;
  std::size_t num_repeated_ = 0;  // elements written by repetitions so far
};

}  // namespace

namespace {

Result<void> keep_json_safe(Grammar& g) {
  ByteSet unsafe;
  for (int b = 0; b < 0x20; ++b) unsafe.set(b);
  unsafe.set('"');
  unsafe.set('\\');
  std::vector<bool> seen(g.rules.size(), false);
  std::vector<std::uint32_t> work;
  for (std::uint32_t r = 0; r < g.rules.size(); ++r) {
    if (std::string_view(g.rules[r].name).starts_with(kJsonSafeRulePrefix)) {
      seen[r] = true;
      work.push_back(r);
    }
  }
  while (!work.empty()) {
    const std::uint32_t r = work.back();
    work.pop_back();
    for (auto& alt : g.rules[r].alternatives) {
      for (Element& e : alt) {
        if (e.kind == Element::Kind::rule) {
          if (!seen[e.index]) {
            seen[e.index] = true;
            work.push_back(e.index);
          }
          continue;
        }
        const ByteSet safe = g.byte_sets[e.index] & ~unsafe;
        if (safe.none()) {
          return make_error(ErrorCode::invalid_argument,
                            "rule '" + g.rules[r].name +
                                "' must match a quote, a backslash or a control character, which "
                                "a JSON string's text would have to escape (not supported)");
        }
        e.index = g.byte_set_index(safe);
      }
    }
  }
  return {};
}

}  // namespace

Result<Grammar> parse_gbnf(std::string_view text) {
  TROUPE_TRY(Grammar grammar, Parser(text).parse());
  TROUPE_TRY_VOID(keep_json_safe(grammar));
  return grammar;
}

}  // namespace troupe::grammar
