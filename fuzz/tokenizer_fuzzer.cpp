// Both tokenizers on arbitrary text: encode (with and without BOS/EOS, with and
// without special-token parsing), decode and the incremental detokenizer, on
// the built-in SentencePiece vocabulary, small byte-level BPE vocabularies for
// every pre-tokenizer, and the real vocabularies of ../shared where it exists.
//
// Input: byte 0 picks the vocabulary and the flags, the rest is the text.
// Invariants (abort when broken):
//   - every id is a token of the vocabulary;
//   - the detokenizer's pieces add up to decode(), and never end inside a
//     character of a decoded text that is valid UTF-8;
//   - a BPE pre-tokenizer's words are non-empty and cover the text;
//   - decode(encode(text)) is the text (SentencePiece: with its space prefix, and
//     with U+2581 read as a space) unless a special token splits the text or the
//     text holds a byte the vocabulary cannot spell out: real BPE vocabularies
//     lack some (StarCoder and Falcon have no token for 0xfd, Falcon none for
//     0x03; DeepSeek-Coder makes 0xc0 and 0xf5..0xff user-defined), and the
//     encoder drops such a byte, as llama.cpp does.
#include <unistd.h>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "gguf/gguf_file.hpp"
#include "model/random_model.hpp"
#include "text/incremental_detokenizer.hpp"
#include "text/pre_tokenizer.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode.hpp"

using namespace troupe;
using namespace troupe::gguf;
using namespace troupe::model;
using namespace troupe::text;

namespace {

struct FuzzedVocabulary {
  std::string name;
  Tokenizer tokenizer;
  // Bytes with no token of their own: a text that holds one need not round-trip.
  std::array<bool, 256> unspelled{};
  // Texts that encode() splits out: user-defined tokens always, control and
  // unknown ones with parse_special.
  std::vector<std::string> always_split;
  std::vector<std::string> split_when_parsed;
};

std::vector<FuzzedVocabulary>& vocabularies() {
  static std::vector<FuzzedVocabulary> all;
  return all;
}

[[noreturn]] void fail_setup(const std::string& what) {
  std::fprintf(stderr, "tokenizer_fuzzer: %s\n", what.c_str());
  std::abort();
}

Tokenizer tokenizer_from_file(const std::string& path) {
  auto file = GgufFile::open(path);
  if (!file) fail_setup(path + ": " + file.error().message);
  auto tokenizer = Tokenizer::from_gguf(*file);
  if (!tokenizer) fail_setup(path + ": " + tokenizer.error().message);
  return std::move(*tokenizer);
}

// GPT-2's bytes_to_unicode: the letter that stands for each byte in BPE token texts.
std::string byte_letter(int b) {
  static const std::vector<std::string> letters = [] {
    std::vector<std::string> out(256);
    char32_t next = 256;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174;
      append_utf8(out[i], printable ? static_cast<char32_t>(i) : next++);
    }
    return out;
  }();
  return letters[b];
}

std::string in_byte_letters(std::string_view text) {
  std::string out;
  for (char c : text) out += byte_letter(static_cast<unsigned char>(c));
  return out;
}

// A small byte-level BPE vocabulary: all 256 byte letters, the merges that build
// a few words (ASCII, accented, CJK, digits, with and without a leading space),
// three control tokens and one user-defined token. `pre` names its pre-tokenizer.
Tokenizer synthetic_bpe(const std::string& pre) {
  Vocabulary v;
  v.kind = VocabularyKind::bpe;
  v.pre = pre;
  v.add_space_prefix = false;
  auto add_token = [&](const std::string& text, TokenType type) {
    if (v.token_ids.contains(text)) return;
    v.token_ids.emplace(text, static_cast<TokenId>(v.tokens.size()));
    v.tokens.push_back(text);
    v.types.push_back(type);
  };
  for (int b = 0; b < 256; ++b) add_token(byte_letter(b), TokenType::normal);
  static const char* const kWords[] = {
      "the", " the", "and",  " and", "ing",  " hello", " world",       "Hello",
      "'s",  "'ll",  " 123", "2024", "\n\n", "  ",     " caf\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac",
      " <|", "|>",   "();"};
  for (const char* word : kWords) {
    const std::string letters = in_byte_letters(word);
    // Merge left to right: "a b" -> "ab", "ab c" -> "abc", ... one letter (code point) at a time.
    const auto chars = decode_utf8(letters);
    std::string left = letters.substr(0, chars[0].length);
    for (std::size_t i = 1; i < chars.size(); ++i) {
      const std::string right = letters.substr(chars[i].offset, chars[i].length);
      v.merges.push_back(left + " " + right);
      left += right;
      add_token(left, TokenType::normal);
    }
  }
  v.bos = static_cast<TokenId>(v.tokens.size());
  add_token("<|begin_of_text|>", TokenType::control);
  v.eos = static_cast<TokenId>(v.tokens.size());
  add_token("<|endoftext|>", TokenType::control);
  v.eot = static_cast<TokenId>(v.tokens.size());
  add_token("<|eot_id|>", TokenType::control);
  add_token("<|fim_middle|>", TokenType::user_defined);
  v.add_bos = pre == "llama-bpe";
  v.end_of_generation = {v.eos, v.eot};
  auto tokenizer = Tokenizer::from_vocabulary(std::move(v));
  if (!tokenizer) fail_setup(pre + ": " + tokenizer.error().message);
  return std::move(*tokenizer);
}

bool is_valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_char_length(s.substr(i));
    if (n == 1 && static_cast<unsigned char>(s[i]) >= 0x80) return false;
    i += n;
  }
  return true;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  for (std::size_t pos = 0;;) {
    const std::size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) return out.append(text.substr(pos));
    out.append(text.substr(pos, hit - pos)).append(to);
    pos = hit + from.size();
  }
}

// The token that spells out one byte: "<0x41>" (SentencePiece), or the byte's letter (BPE).
bool spells_byte(const Vocabulary& vocab, int b) {
  if (vocab.kind == VocabularyKind::bpe) {
    const TokenId id = vocab.find(byte_letter(b));
    return id != kNoToken && vocab.types[id] == TokenType::normal;
  }
  char name[8];
  std::snprintf(name, sizeof(name), "<0x%02X>", b);
  const TokenId id = vocab.find(name);
  return id != kNoToken && vocab.types[id] == TokenType::byte;
}

void add_vocabulary(std::string name, Tokenizer tokenizer) {
  FuzzedVocabulary v{std::move(name), std::move(tokenizer), {}, {}, {}};
  const Vocabulary& vocab = v.tokenizer.vocabulary();
  int num_unspelled = 0;
  for (int b = 0; b < 256; ++b) {
    v.unspelled[b] = !spells_byte(vocab, b);
    num_unspelled += v.unspelled[b];
  }
  std::fprintf(stderr, "tokenizer_fuzzer: %s, %zu tokens, %d bytes without a token\n",
               v.name.c_str(), vocab.size(), num_unspelled);
  for (std::size_t id = 0; id < vocab.size(); ++id) {
    if (vocab.tokens[id].empty()) continue;
    const TokenType type = vocab.types[id];
    if (type == TokenType::user_defined) v.always_split.push_back(vocab.tokens[id]);
    if (type == TokenType::control || type == TokenType::unknown) {
      v.split_when_parsed.push_back(vocab.tokens[id]);
    }
  }
  vocabularies().push_back(std::move(v));
}

// Whether a special token is split out of `text` (then the text around it is
// encoded in pieces, and SentencePiece prefixes each with a space).
bool splits_special(const FuzzedVocabulary& v, std::string_view text, bool parse_special) {
  auto occurs = [&](const std::vector<std::string>& needles) {
    for (const std::string& needle : needles) {
      if (text.find(needle) != std::string_view::npos) return true;
    }
    return false;
  };
  return occurs(v.always_split) || (parse_special && occurs(v.split_when_parsed));
}

std::string expected_decode(const Tokenizer& tokenizer, std::string_view text) {
  const Vocabulary& v = tokenizer.vocabulary();
  if (v.kind == VocabularyKind::bpe) return std::string(text);
  const std::string prefix = v.add_space_prefix && !text.empty() ? " " : "";
  return prefix + replace_all(text, "\xe2\x96\x81", " ");
}

void check_pre_tokenizer(const Tokenizer& tokenizer, std::string_view text) {
  const auto pre = pre_tokenizer_from_name(tokenizer.vocabulary().pre);
  if (!pre) return;
  std::size_t covered = 0;
  for (std::string_view word : pre_tokenize(*pre, text)) {
    TROUPE_FUZZ_CHECK(!word.empty(), "the pre-tokenizer made an empty word");
    TROUPE_FUZZ_CHECK(word.data() == text.data() + covered,
                      "the pre-tokenizer's words do not follow each other");
    covered += word.size();
  }
  TROUPE_FUZZ_CHECK(covered == text.size(), "the pre-tokenizer's words do not cover the text");
}

// What a broken invariant needs to be understood: the vocabulary, the text, the ids.
void describe(const FuzzedVocabulary& v, std::string_view text, const std::vector<TokenId>& ids,
              std::string_view decoded) {
  auto hex = [](std::string_view s) {
    std::string out;
    char buf[4];
    for (char c : s) {
      std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(c));
      out += buf;
    }
    return out;
  };
  std::fprintf(stderr, "vocabulary: %s\ntext:    %s\ndecoded: %s\nids:", v.name.c_str(),
               hex(text).c_str(), hex(decoded).c_str());
  for (const TokenId id : ids) std::fprintf(stderr, " %d", id);
  std::fprintf(stderr, "\n");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  add_vocabulary("built-in spm", fuzz::builtin_spm_tokenizer(4096));
  for (const char* pre : {"gpt-2", "llama-bpe", "qwen2", "starcoder", "falcon", "deepseek-coder"}) {
    add_vocabulary(std::string("synthetic bpe ") + pre, synthetic_bpe(pre));
  }
  // llama.cpp's vocabulary files, where ../shared is (the first six give the same indices
  // with or without it).
  const auto vocab_dir = troupe::fuzz::shared_dir() / "vocab";
  for (const char* name :
       {"llama-spm", "phi-3", "gpt-2", "starcoder", "falcon", "deepseek-coder"}) {
    const auto path = vocab_dir / ("ggml-vocab-" + std::string(name) + ".gguf");
    if (std::filesystem::exists(path)) add_vocabulary(name, tokenizer_from_file(path.string()));
  }
  std::fprintf(stderr, "tokenizer_fuzzer: %zu vocabularies\n", vocabularies().size());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto& all = vocabularies();
  const FuzzedVocabulary& vocab = all[(data[0] >> 2) % all.size()];
  const bool add_special = (data[0] & 1) != 0;
  const bool parse_special = (data[0] & 2) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Tokenizer& tokenizer = vocab.tokenizer;

  const std::vector<TokenId> ids = tokenizer.encode(text, add_special, parse_special);
  for (const TokenId id : ids) {
    TROUPE_FUZZ_CHECK(id >= 0 && static_cast<std::size_t>(id) < tokenizer.size(),
                      "a token id is outside the vocabulary");
  }
  const std::string decoded = tokenizer.decode(ids);
  (void)tokenizer.decode(ids, /*render_special=*/true);

  IncrementalDetokenizer detokenizer(tokenizer);
  const bool decoded_valid = is_valid_utf8(decoded);
  std::string streamed;
  for (const TokenId id : ids) {
    const std::string chunk = detokenizer.push(id);
    if (decoded_valid) {
      TROUPE_FUZZ_CHECK(is_valid_utf8(chunk), "a streamed piece ends inside a character");
    }
    streamed += chunk;
  }
  streamed += detokenizer.flush();
  TROUPE_FUZZ_CHECK(streamed == decoded, "the streamed pieces are not the decoded text");

  if (tokenizer.vocabulary().kind == VocabularyKind::bpe) check_pre_tokenizer(tokenizer, text);

  bool spelled = true;
  for (const char c : text) spelled = spelled && !vocab.unspelled[static_cast<unsigned char>(c)];
  if (spelled && !splits_special(vocab, text, parse_special)) {
    if (decoded != expected_decode(tokenizer, text)) describe(vocab, text, ids, decoded);
    TROUPE_FUZZ_CHECK(decoded == expected_decode(tokenizer, text),
                      "decode(encode(text)) is not the text");
  }
  return 0;
}
