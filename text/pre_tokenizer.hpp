// The regex splits that byte-level BPE vocabularies apply before merging, one
// hand-written matcher per regex, with the semantics of a leftmost-first
// regex search: matches and the gaps between them all become words.
#pragma once

#include <string_view>
#include <vector>

#include "troupe/result.hpp"

namespace troupe::text {

enum class PreTokenizer {
  gpt2,            // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  llama3,          // case-insensitive contractions, [^\r\n\p{L}\p{N}]?\p{L}+, \p{N}{1,3}, ...
  qwen2,           // llama3's with single digits
  starcoder,       // \p{N}, then gpt2
  falcon,          // [\p{P}$+<=>^~|`]+, then gpt2, then [0-9][0-9][0-9]
  deepseek_coder,  // [\r\n], \s?\p{L}+, \s?\p{P}+, [CJK and Hangul]+, \p{N}
};

// The pre-tokenizer a GGUF's tokenizer.ggml.pre names (llama.cpp's names).
Result<PreTokenizer> pre_tokenizer_from_name(std::string_view name);

// Splits text into words, each a non-empty view of `text`, covering all of it in order.
std::vector<std::string_view> pre_tokenize(PreTokenizer pre, std::string_view text);

}  // namespace troupe::text
