#include "grammar/utf8_ranges.hpp"

#include <algorithm>

namespace troupe::grammar {

namespace {

constexpr std::uint32_t kMaxForLength[] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};

int encoded_length(std::uint32_t c) {
  return c <= 0x7F ? 1 : c <= 0x7FF ? 2 : c <= 0xFFFF ? 3 : 4;
}

// lo..hi, both of one encoded length.
void split_same_length(std::uint32_t lo, std::uint32_t hi, std::vector<ByteRangeSequence>& out) {
  const int n = encoded_length(lo);
  // Where lo and hi differ above their last i continuation bytes, cut so that each part
  // either fixes those bytes or spans all of them (0x80-0xBF).
  for (int i = 1; i < n; ++i) {
    const std::uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_same_length(lo, lo | m, out);
        split_same_length((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_same_length(lo, (hi & ~m) - 1, out);
        split_same_length(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = utf8_encode(lo), b = utf8_encode(hi);
  ByteRangeSequence sequence;
  for (std::size_t k = 0; k < a.size(); ++k) {
    sequence.emplace_back(static_cast<std::uint8_t>(a[k]), static_cast<std::uint8_t>(b[k]));
  }
  out.push_back(std::move(sequence));
}

void split(std::uint32_t lo, std::uint32_t hi, std::vector<ByteRangeSequence>& out) {
  if (lo > hi) return;
  if (lo < 0xD800 && hi > 0xDFFF) {  // around the surrogates
    split(lo, 0xD7FF, out);
    split(0xE000, hi, out);
    return;
  }
  if (lo >= 0xD800 && hi <= 0xDFFF) return;
  if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
  if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
  if (lo > hi) return;
  for (int n = 1; n < 4; ++n) {  // one encoded length at a time
    if (lo <= kMaxForLength[n] && hi > kMaxForLength[n]) {
      split(lo, kMaxForLength[n], out);
      split(kMaxForLength[n] + 1, hi, out);
      return;
    }
  }
  split_same_length(lo, hi, out);
}

}  // namespace

std::string utf8_encode(std::uint32_t c) {
  std::string s;
  if (c <= 0x7F) {
    s += static_cast<char>(c);
  } else if (c <= 0x7FF) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c <= 0xFFFF) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

std::vector<ByteRangeSequence> utf8_sequences(std::uint32_t lo, std::uint32_t hi) {
  std::vector<ByteRangeSequence> out;
  split(lo, std::min<std::uint32_t>(hi, 0x10FFFF), out);
  return out;
}

}  // namespace troupe::grammar
