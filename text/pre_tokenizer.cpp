#include "text/pre_tokenizer.hpp"

#include <string>

#include "text/unicode.hpp"

namespace troupe::text {

namespace {

// The decoded text a matcher looks at: code points with their categories.
struct Text {
  std::vector<Utf8Char> chars;
  std::vector<UnicodeCategory> categories;
  std::vector<bool> whitespace;
};

struct Range {
  std::size_t begin;  // in characters
  std::size_t end;
};

// A regex over one word [pos, end): the length of the leftmost-first match
// starting exactly at pos, or 0.
using Matcher = std::size_t (*)(const Text&, std::size_t pos, std::size_t end);

bool letter(const Text& t, std::size_t i, std::size_t end) {
  return i < end && t.categories[i] == kLetter;
}
bool number(const Text& t, std::size_t i, std::size_t end) {
  return i < end && t.categories[i] == kNumber;
}
bool space(const Text& t, std::size_t i, std::size_t end) {
  return i < end && t.whitespace[i];
}
bool newline(const Text& t, std::size_t i, std::size_t end) {
  return i < end && (t.chars[i].cp == '\r' || t.chars[i].cp == '\n');
}
// [^\s\p{L}\p{N}]
bool other(const Text& t, std::size_t i, std::size_t end) {
  return i < end && !t.whitespace[i] && t.categories[i] != kLetter && t.categories[i] != kNumber;
}
char32_t lower_ascii(char32_t c) {
  return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

template <typename Pred>
std::size_t run(const Text& t, std::size_t i, std::size_t end, Pred pred) {
  std::size_t j = i;
  while (pred(t, j, end)) ++j;
  return j - i;
}

// 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive.
std::size_t contraction(const Text& t, std::size_t pos, std::size_t end, bool any_case) {
  if (t.chars[pos].cp != '\'' || pos + 1 >= end) return 0;
  auto at = [&](std::size_t i) {
    return i < end ? (any_case ? lower_ascii(t.chars[i].cp) : t.chars[i].cp) : char32_t{0};
  };
  const char32_t a = at(pos + 1), b = at(pos + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// \s+(?!\S)|\s+ at pos (the tail every GPT-style regex ends with).
std::size_t trailing_space(const Text& t, std::size_t pos, std::size_t end) {
  const std::size_t n = run(t, pos, end, space);
  if (n == 0) return 0;
  if (pos + n == end || n == 1) return n;  // at the end, or \s+ alone
  return n - 1;                            // leave one space to lead the next word
}

std::size_t match_gpt2(const Text& t, std::size_t pos, std::size_t end) {
  if (const std::size_t n = contraction(t, pos, end, false)) return n;
  const std::size_t sp = t.chars[pos].cp == ' ' ? 1 : 0;
  if (letter(t, pos + sp, end)) return sp + run(t, pos + sp, end, letter);
  if (number(t, pos + sp, end)) return sp + run(t, pos + sp, end, number);
  if (other(t, pos + sp, end)) return sp + run(t, pos + sp, end, other);
  return trailing_space(t, pos, end);
}

std::size_t match_llama3_like(const Text& t, std::size_t pos, std::size_t end,
                              std::size_t max_digits) {
  if (const std::size_t n = contraction(t, pos, end, true)) return n;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (letter(t, pos, end)) return run(t, pos, end, letter);
  if (!newline(t, pos, end) && !number(t, pos, end) && letter(t, pos + 1, end)) {
    return 1 + run(t, pos + 1, end, letter);
  }
  // \p{N}{1,max}
  if (number(t, pos, end)) return std::min(max_digits, run(t, pos, end, number));
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  const std::size_t sp = t.chars[pos].cp == ' ' ? 1 : 0;
  if (other(t, pos + sp, end)) {
    const std::size_t n = sp + run(t, pos + sp, end, other);
    return n + run(t, pos + n, end, newline);
  }
  // \s*[\r\n]+ : up to and including the last newline of the white-space run
  const std::size_t n = run(t, pos, end, space);
  for (std::size_t k = n; k > 0; --k) {
    if (newline(t, pos + k - 1, end)) return k;
  }
  return trailing_space(t, pos, end);
}

std::size_t match_llama3(const Text& t, std::size_t pos, std::size_t end) {
  return match_llama3_like(t, pos, end, 3);
}
std::size_t match_qwen2(const Text& t, std::size_t pos, std::size_t end) {
  return match_llama3_like(t, pos, end, 1);
}

// \p{N}
std::size_t match_digit(const Text& t, std::size_t pos, std::size_t end) {
  return number(t, pos, end) ? 1 : 0;
}

// [\p{P}\$\+<=>\^~\|`]+
std::size_t match_falcon_punctuation(const Text& t, std::size_t pos, std::size_t end) {
  auto punct = [](const Text& tx, std::size_t i, std::size_t e) {
    if (i >= e) return false;
    const char32_t c = tx.chars[i].cp;
    return tx.categories[i] == kPunctuation || c == '$' || c == '+' || c == '<' || c == '=' ||
           c == '>' || c == '^' || c == '~' || c == '|' || c == '`';
  };
  return run(t, pos, end, punct);
}

// [0-9][0-9][0-9]
std::size_t match_three_ascii_digits(const Text& t, std::size_t pos, std::size_t end) {
  auto digit = [](const Text& tx, std::size_t i, std::size_t e) {
    return i < e && tx.chars[i].cp >= '0' && tx.chars[i].cp <= '9';
  };
  return run(t, pos, end, digit) >= 3 ? 3 : 0;
}

// [\r\n]
std::size_t match_newline(const Text& t, std::size_t pos, std::size_t end) {
  return newline(t, pos, end) ? 1 : 0;
}

// \s?\p{L}+
std::size_t match_space_letters(const Text& t, std::size_t pos, std::size_t end) {
  const std::size_t sp = space(t, pos, end) ? 1 : 0;
  if (letter(t, pos + sp, end)) return sp + run(t, pos + sp, end, letter);
  return 0;
}

// \s?\p{P}+
std::size_t match_space_punctuation(const Text& t, std::size_t pos, std::size_t end) {
  auto punct = [](const Text& tx, std::size_t i, std::size_t e) {
    return i < e && tx.categories[i] == kPunctuation;
  };
  const std::size_t sp = space(t, pos, end) ? 1 : 0;
  if (punct(t, pos + sp, end)) return sp + run(t, pos + sp, end, punct);
  return 0;
}

// [一-龥ࠀ-一가-퟿]+
std::size_t match_cjk(const Text& t, std::size_t pos, std::size_t end) {
  auto cjk = [](const Text& tx, std::size_t i, std::size_t e) {
    if (i >= e) return false;
    const char32_t c = tx.chars[i].cp;
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x0800 && c <= 0x4E00) ||
           (c >= 0xAC00 && c <= 0xD7FF);
  };
  return run(t, pos, end, cjk);
}

// One regex over every current word: matches and the gaps between them become words.
std::vector<Range> split(const Text& t, const std::vector<Range>& words, Matcher match) {
  std::vector<Range> out;
  out.reserve(words.size());
  for (const Range& w : words) {
    std::size_t gap = w.begin;
    for (std::size_t pos = w.begin; pos < w.end;) {
      const std::size_t n = match(t, pos, w.end);
      if (n == 0) {
        ++pos;
        continue;
      }
      if (gap < pos) out.push_back({gap, pos});
      out.push_back({pos, pos + n});
      pos += n;
      gap = pos;
    }
    if (gap < w.end) out.push_back({gap, w.end});
  }
  return out;
}

std::vector<Matcher> matchers(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::gpt2:
      return {match_gpt2};
    case PreTokenizer::llama3:
      return {match_llama3};
    case PreTokenizer::qwen2:
      return {match_qwen2};
    case PreTokenizer::starcoder:
      return {match_digit, match_gpt2};
    case PreTokenizer::falcon:
      return {match_falcon_punctuation, match_gpt2, match_three_ascii_digits};
    case PreTokenizer::deepseek_coder:
      return {match_newline, match_space_letters, match_space_punctuation, match_cjk, match_digit};
  }
  return {match_gpt2};
}

}  // namespace

Result<PreTokenizer> pre_tokenizer_from_name(std::string_view name) {
  if (name.empty() || name == "default" || name == "gpt-2" || name == "gpt2" || name == "mpt" ||
      name == "olmo" || name == "jais") {
    return PreTokenizer::gpt2;
  }
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "smaug-bpe") {
    return PreTokenizer::llama3;
  }
  if (name == "qwen2") return PreTokenizer::qwen2;
  if (name == "starcoder" || name == "refact" || name == "command-r")
    return PreTokenizer::starcoder;
  if (name == "falcon") return PreTokenizer::falcon;
  if (name == "deepseek-coder") return PreTokenizer::deepseek_coder;
  return make_error(ErrorCode::unsupported, "tokenizer.ggml.pre '" + std::string(name) +
                                                "' is not a pre-tokenizer troupe knows");
}

std::vector<std::string_view> pre_tokenize(PreTokenizer pre, std::string_view text) {
  Text t;
  t.chars = decode_utf8(text);
  t.categories.reserve(t.chars.size());
  t.whitespace.reserve(t.chars.size());
  for (const auto& c : t.chars) {
    t.categories.push_back(unicode_category(c.cp));
    t.whitespace.push_back(is_unicode_whitespace(c.cp));
  }
  std::vector<Range> words;
  if (!t.chars.empty()) words.push_back({0, t.chars.size()});
  for (Matcher m : matchers(pre)) words = split(t, words, m);
  std::vector<std::string_view> out;
  out.reserve(words.size());
  for (const Range& w : words) {
    const std::size_t begin = t.chars[w.begin].offset;
    const std::size_t end = t.chars[w.end - 1].offset + t.chars[w.end - 1].length;
    out.push_back(text.substr(begin, end - begin));
  }
  return out;
}

}  // namespace troupe::text
