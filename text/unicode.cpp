#include "text/unicode.hpp"

#include <algorithm>

namespace troupe::text {

UnicodeCategory unicode_category(char32_t cp) {
  if (cp > 0x10FFFF) return kUndefined;
  const auto* begin = detail::kCategoryRanges;
  const auto* end = begin + detail::kNumCategoryRanges;
  const auto* it = std::upper_bound(
      begin, end, cp, [](char32_t c, const detail::CategoryRange& r) { return c < r.first; });
  return (it - 1)->category;
}

bool is_unicode_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::vector<Utf8Char> decode_utf8(std::string_view text) {
  std::vector<Utf8Char> out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t n = 0;
    char32_t cp = 0;
    if (lead < 0x80)
      n = 1, cp = lead;
    else if ((lead & 0xE0) == 0xC0)
      n = 2, cp = lead & 0x1F;
    else if ((lead & 0xF0) == 0xE0)
      n = 3, cp = lead & 0x0F;
    else if ((lead & 0xF8) == 0xF0)
      n = 4, cp = lead & 0x07;
    bool valid = n > 0 && i + n <= text.size();
    for (std::size_t k = 1; valid && k < n; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      valid = (c & 0xC0) == 0x80;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (!valid) {
      out.push_back({0xFFFD, static_cast<std::uint32_t>(i), 1});
      ++i;
      continue;
    }
    out.push_back({cp, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(n)});
    i += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string to_valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const Utf8Char& c : decode_utf8(text)) {
    // decode_utf8 turns each invalid byte into U+FFFD of length 1; a real U+FFFD is 3 bytes.
    // decode_utf8 is lenient as llama.cpp's tokenizer is; UTF-8 itself is not: overlong
    // forms (C0 80 for NUL), code points past U+10FFFF and surrogates are invalid.
    const bool replaced = c.cp == 0xFFFD && c.length == 1;
    const bool surrogate = c.cp >= 0xD800 && c.cp <= 0xDFFF;
    const char32_t shortest = c.length == 2 ? 0x80 : c.length == 3 ? 0x800 : 0x10000;
    const bool overlong = c.length > 1 && c.cp < shortest;
    if (overlong || c.cp > 0x10FFFF) {
      for (std::uint32_t k = 0; k < c.length; ++k) out += "\xef\xbf\xbd";
    } else if (replaced || surrogate) {
      out += "\xef\xbf\xbd";
    } else {
      out.append(text.substr(c.offset, c.length));
    }
  }
  return out;
}

}  // namespace troupe::text
