// Unicode code point ranges as UTF-8 byte sequences: a character class over code points
// becomes alternatives of byte ranges, one range per byte of the encoding (the split of
// RE2 and Go's utf8 ranges).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::grammar {

// One byte range per byte of a sequence: [first, last] inclusive.
using ByteRangeSequence = std::vector<std::pair<std::uint8_t, std::uint8_t>>;

// Sequences matching exactly the UTF-8 encodings of code points lo..hi (surrogates
// D800-DFFF excluded: they have no valid encoding).
std::vector<ByteRangeSequence> utf8_sequences(std::uint32_t lo, std::uint32_t hi);

// The UTF-8 encoding of one code point (<= 0x10FFFF).
std::string utf8_encode(std::uint32_t code_point);

}  // namespace troupe::grammar
