// Random byte strings through encode, decode and the incremental detokenizer:
// no byte is lost or invented, and no chunk ends inside a UTF-8 sequence.
#include <catch2/catch.hpp>
#include <filesystem>
#include <random>

#include "gguf/gguf_file.hpp"
#include "model/random_model.hpp"
#include "support/small_model.hpp"
#include "text/incremental_detokenizer.hpp"
#include "text/tokenizer.hpp"

using namespace troupe;
using namespace troupe::gguf;
using namespace troupe::model;
using namespace troupe::text;

namespace {

std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> atoms = {
      "a", "e", "the",  " ",    "  ",   "\n",           "\t",  "Hello", "world",
      "é", "ß", "日本", "🦙", "😀",    "\xe2\x82\xac", "1",   "23",    ",",
      ".", "!", "'s",   "\xff", "\x80", "\xc3",         "<s>", "</s>"};
  std::string s;
  const int n = static_cast<int>(rng() % 24);
  for (int i = 0; i < n; ++i) s += atoms[rng() % atoms.size()];
  return s;
}

bool is_valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_char_length(s.substr(i));
    if (n == 1 && static_cast<unsigned char>(s[i]) >= 0x80) return false;
    i += n;
  }
  return true;
}

// exact_for_invalid_utf8: whether text with invalid UTF-8 bytes also decodes to itself.
// DeepSeek-Coder's vocabulary adds the byte-alphabet letters of the bytes that never
// occur in valid UTF-8 (0xF5..0xFF, 0xC0, 0xC1) as user-defined tokens, which decode
// as those letters (as in llama.cpp and Hugging Face), so only valid text round-trips.
void roundtrip(const Tokenizer& tokenizer, int iterations, bool exact_for_invalid_utf8 = true) {
  std::mt19937 rng(7);
  for (int i = 0; i < iterations; ++i) {
    const std::string text = random_text(rng);
    INFO("text: '" << text << "'");
    const auto ids = tokenizer.encode(text, /*add_special=*/true);
    for (TokenId id : ids) REQUIRE((id >= 0 && static_cast<std::size_t>(id) < tokenizer.size()));
    const bool valid = is_valid_utf8(text);
    // SentencePiece adds one space in front of the text; byte-level BPE adds nothing.
    const bool prefix = tokenizer.vocabulary().kind == VocabularyKind::spm &&
                        tokenizer.vocabulary().add_space_prefix && !text.empty();
    if (valid || exact_for_invalid_utf8)
      CHECK(tokenizer.decode(ids) == (prefix ? " " + text : text));
    // Where the text is valid UTF-8, no chunk may end inside a character; invalid
    // bytes pass through as they are.
    IncrementalDetokenizer detokenizer(tokenizer);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string chunk = detokenizer.push(id);
      if (valid) CHECK(is_valid_utf8(chunk));
      streamed += chunk;
    }
    streamed += detokenizer.flush();
    CHECK(streamed == tokenizer.decode(ids));
  }
}

}  // namespace

TEST_CASE("the built-in vocabulary round-trips random text", "[tokenizer][fuzz]") {
  const std::string path = test::write_small_model(
      "roundtrip-vocab", [](RandomModelSpec& spec) { spec.vocab_size = 4096; });
  auto file = GgufFile::open(path);
  REQUIRE(file.has_value());
  auto tokenizer = Tokenizer::from_gguf(*file);
  REQUIRE(tokenizer.has_value());
  roundtrip(*tokenizer, 2000);
  std::filesystem::remove(path);
}

TEST_CASE("the Llama-2 vocabulary round-trips random text", "[tokenizer][fuzz][shared]") {
  auto file = GgufFile::open(test::shared_file("vocab/ggml-vocab-llama-spm.gguf"));
  REQUIRE(file.has_value());
  auto tokenizer = Tokenizer::from_gguf(*file);
  REQUIRE(tokenizer.has_value());
  roundtrip(*tokenizer, 2000);
}

TEST_CASE("the GPT-2 vocabulary round-trips random text", "[tokenizer][fuzz][shared]") {
  auto file = GgufFile::open(test::shared_file("vocab/ggml-vocab-gpt-2.gguf"));
  REQUIRE(file.has_value());
  auto tokenizer = Tokenizer::from_gguf(*file);
  REQUIRE(tokenizer.has_value());
  roundtrip(*tokenizer, 2000);
}

TEST_CASE("the DeepSeek-Coder vocabulary round-trips random text", "[tokenizer][fuzz][shared]") {
  auto file = GgufFile::open(test::shared_file("vocab/ggml-vocab-deepseek-coder.gguf"));
  REQUIRE(file.has_value());
  auto tokenizer = Tokenizer::from_gguf(*file);
  REQUIRE(tokenizer.has_value());
  roundtrip(*tokenizer, 2000, /*exact_for_invalid_utf8=*/false);
}
