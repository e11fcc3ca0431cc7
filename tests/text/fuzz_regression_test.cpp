// Inputs the fuzz targets (fuzz/) found that broke an invariant: each case pins
// the fixed behaviour; the reproducers are in fuzz/corpus/ too.
#include <catch2/catch.hpp>

#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "text/tokenizer.hpp"

using namespace troupe;
using namespace troupe::gguf;
using namespace troupe::text;

namespace {

// Two SentencePiece tokens, no byte tokens (fuzz/corpus/gguf_reader/spm-without-unk).
GgufWriter spm_without_byte_tokens() {
  GgufWriter w;
  w.add_string("tokenizer.ggml.model", "llama");
  const std::vector<std::string> tokens = {"a", "b"};
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_bool("tokenizer.ggml.add_bos_token", false);
  return w;
}

}  // namespace

TEST_CASE("a SentencePiece vocabulary that cannot spell a byte needs an unknown token",
          "[tokenizer][fuzz]") {
  SECTION("without one it is rejected, instead of encoding text to token -1") {
    auto file = GgufFile::parse(spm_without_byte_tokens().to_bytes());
    REQUIRE(file.has_value());
    const auto tokenizer = Tokenizer::from_gguf(*file);
    REQUIRE_FALSE(tokenizer.has_value());
    CHECK(tokenizer.error().code == ErrorCode::invalid_file);
    CHECK(tokenizer.error().message ==
          "the SentencePiece vocabulary has no token for byte 0x00 and no unknown token to "
          "stand for it");
  }
  SECTION("with one, every byte it cannot spell becomes that token") {
    GgufWriter w = spm_without_byte_tokens();
    w.add_uint32("tokenizer.ggml.unknown_token_id", 1);
    auto file = GgufFile::parse(w.to_bytes());
    REQUIRE(file.has_value());
    const auto tokenizer = Tokenizer::from_gguf(*file);
    REQUIRE(tokenizer.has_value());
    // " z" is U+2581 (3 bytes) and z: none is a token.
    CHECK(tokenizer->encode("z", /*add_special=*/true) == std::vector<TokenId>{1, 1, 1, 1});
    CHECK(tokenizer->encode("a", /*add_special=*/true) == std::vector<TokenId>{1, 1, 1, 0});
  }
}
