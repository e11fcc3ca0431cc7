// The little Unicode the tokenizers need: UTF-8 decoding that keeps every byte,
// general categories (\p{L}, \p{N}, \p{P}, ...) and white space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::text {

enum UnicodeCategory : std::uint8_t {
  kUndefined = 0,  // unassigned (Cn)
  kLetter,         // L*
  kNumber,         // N*
  kPunctuation,    // P*
  kSymbol,         // S*
  kMark,           // M*
  kSeparator,      // Z*
  kControl,        // Cc, Cf, Cs, Co
};

UnicodeCategory unicode_category(char32_t cp);
// The White_Space property (what regex \s matches).
bool is_unicode_whitespace(char32_t cp);

// One character of a text: its code point and the bytes it came from. A byte
// that starts no valid UTF-8 sequence becomes U+FFFD of length 1, so that
// splitting by characters never loses or merges bytes.
struct Utf8Char {
  char32_t cp;
  std::uint32_t offset;  // in bytes
  std::uint32_t length;  // in bytes
};
std::vector<Utf8Char> decode_utf8(std::string_view text);

void append_utf8(std::string& out, char32_t cp);

// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD
// (what JSON, SSE and WebSocket text frames need; Python's errors="replace").
std::string to_valid_utf8(std::string_view text);

namespace detail {
struct CategoryRange {
  char32_t first;  // the range runs to the next entry's first
  UnicodeCategory category;
};
extern const CategoryRange kCategoryRanges[];
extern const std::size_t kNumCategoryRanges;
}  // namespace detail

}  // namespace troupe::text
