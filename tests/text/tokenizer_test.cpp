#include <catch2/catch.hpp>
#include <sstream>

#include "gguf/gguf_file.hpp"
#include "support/test_support.hpp"
#include "text/incremental_detokenizer.hpp"
#include "text/tokenizer.hpp"

using namespace troupe;
using namespace troupe::gguf;
using namespace troupe::text;

namespace {

Tokenizer load(const std::string& relative) {
  auto file = GgufFile::open(test::shared_file(relative));
  REQUIRE(file.has_value());
  auto tokenizer = Tokenizer::from_gguf(*file);
  if (!tokenizer) FAIL(tokenizer.error().message);
  return std::move(*tokenizer);
}

struct VocabCase {
  std::string text;
  std::string expected;  // ids, space separated, each with a leading space
};

std::vector<VocabCase> vocab_cases(const std::string& name) {
  const std::string inputs = test::read_text(test::shared_file("vocab/" + name + ".gguf.inp"));
  std::istringstream outputs(test::read_text(test::shared_file("vocab/" + name + ".gguf.out")));
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  std::size_t pos = 0;
  while (true) {
    const std::size_t hit = inputs.find(separator, pos);
    if (hit == std::string::npos) break;
    VocabCase c;
    c.text = inputs.substr(pos, hit - pos);
    std::getline(outputs, c.expected);
    cases.push_back(c);
    pos = hit + separator.size();
  }
  return cases;
}

std::string joined(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

void check_vocab(const std::string& name) {
  const Tokenizer tokenizer = load("vocab/" + name + ".gguf");
  const auto cases = vocab_cases(name);
  REQUIRE(cases.size() > 30);
  for (const auto& c : cases) {
    INFO(name << ": '" << c.text << "'");
    CHECK(joined(tokenizer.encode(c.text, /*add_special=*/false)) == c.expected);
  }
}

}  // namespace

TEST_CASE("SentencePiece ids equal the reference for every Llama-2 test string",
          "[tokenizer][shared]") {
  check_vocab("ggml-vocab-llama-spm");
}

TEST_CASE("SentencePiece ids equal the reference for every Phi-3 test string",
          "[tokenizer][shared]") {
  check_vocab("ggml-vocab-phi-3");
}

TEST_CASE("byte-level BPE ids equal the reference for every GPT-2 test string",
          "[tokenizer][shared]") {
  check_vocab("ggml-vocab-gpt-2");
}

TEST_CASE("byte-level BPE ids equal the reference for every StarCoder test string",
          "[tokenizer][shared]") {
  check_vocab("ggml-vocab-starcoder");
}

TEST_CASE("byte-level BPE ids equal the reference for every Falcon test string",
          "[tokenizer][shared]") {
  check_vocab("ggml-vocab-falcon");
}

TEST_CASE("byte-level BPE ids equal the reference for every DeepSeek-Coder test string",
          "[tokenizer][shared]") {
  check_vocab("ggml-vocab-deepseek-coder");
}

TEST_CASE("BPE pieces decode the byte alphabet back to bytes", "[tokenizer][shared]") {
  const Tokenizer tokenizer = load("vocab/ggml-vocab-gpt-2.gguf");
  const TokenId space_the = tokenizer.vocabulary().find("\xc4\xa0the");  // "Ġthe"
  REQUIRE(space_the != kNoToken);
  CHECK(tokenizer.piece(space_the) == " the");
  const std::string text = "caf\xc3\xa9 \xf0\x9f\xa6\x99\n\tx";
  CHECK(tokenizer.decode(tokenizer.encode(text, false)) == text);
  CHECK(tokenizer.piece(50256).empty());  // <|endoftext|> is a control token
}

TEST_CASE("prompt ids equal llama.cpp's for the golden prompts", "[tokenizer][shared]") {
  const Tokenizer tokenizer = load("models/stories260K.gguf");
  CHECK(tokenizer.encode("Once upon a time", true) == std::vector<TokenId>{1, 403, 407, 261, 378});
  CHECK(tokenizer.encode("Lily and Ben", true) == std::vector<TokenId>{1, 317, 269, 368, 302});
  CHECK(tokenizer.encode("The", true) == std::vector<TokenId>{1, 291});
  CHECK(tokenizer.encode("", true) == std::vector<TokenId>{1});
  CHECK(tokenizer.encode("", false).empty());
}

TEST_CASE("pieces turn the space mark into a space and byte tokens into bytes",
          "[tokenizer][shared]") {
  const Tokenizer tokenizer = load("vocab/ggml-vocab-llama-spm.gguf");
  CHECK(tokenizer.piece(tokenizer.vocabulary().find("\xe2\x96\x81the")) == " the");
  CHECK(tokenizer.piece(tokenizer.vocabulary().find("<0x0A>")) == "\n");
  CHECK(tokenizer.piece(1).empty());  // <s> is a control token
  CHECK(tokenizer.piece(1, /*render_special=*/true) == "<s>");
  // A character outside the vocabulary falls back to its UTF-8 bytes.
  const auto ids = tokenizer.encode("\xf0\x9f\xa6\x99", false);  // the llama emoji
  CHECK(tokenizer.decode(ids) == " \xf0\x9f\xa6\x99");
}

TEST_CASE("control tokens in text are parsed only when asked", "[tokenizer][shared]") {
  const Tokenizer tokenizer = load("vocab/ggml-vocab-llama-spm.gguf");
  const auto plain = tokenizer.encode("a</s>b", false, /*parse_special=*/false);
  const auto parsed = tokenizer.encode("a</s>b", false, /*parse_special=*/true);
  CHECK(std::find(plain.begin(), plain.end(), 2) == plain.end());
  REQUIRE(parsed.size() >= 3);
  CHECK(std::find(parsed.begin(), parsed.end(), 2) != parsed.end());
}

TEST_CASE("the incremental detokenizer holds an unfinished UTF-8 sequence", "[tokenizer][shared]") {
  const Tokenizer tokenizer = load("vocab/ggml-vocab-llama-spm.gguf");
  // "🦙" is spelled as four byte tokens; nothing may come out until the last one.
  const auto ids = tokenizer.encode("x\xf0\x9f\xa6\x99y", false);
  IncrementalDetokenizer detokenizer(tokenizer);
  std::string streamed;
  std::vector<std::string> chunks;
  for (TokenId id : ids) {
    chunks.push_back(detokenizer.push(id));
    streamed += chunks.back();
  }
  streamed += detokenizer.flush();
  CHECK(streamed == tokenizer.decode(ids));
  for (const auto& c : chunks) CHECK(incomplete_utf8_suffix(c) == 0);
  CHECK(std::find(chunks.begin(), chunks.end(), "\xf0\x9f\xa6\x99") != chunks.end());
}

TEST_CASE("incomplete_utf8_suffix finds only sequences that can still complete", "[tokenizer]") {
  CHECK(incomplete_utf8_suffix("") == 0);
  CHECK(incomplete_utf8_suffix("abc") == 0);
  CHECK(incomplete_utf8_suffix("a\xc3") == 1);
  CHECK(incomplete_utf8_suffix("a\xc3\xa9") == 0);
  CHECK(incomplete_utf8_suffix("\xf0\x9f\xa6") == 3);
  CHECK(incomplete_utf8_suffix("\xf0\x9f\xa6\x99") == 0);
  CHECK(incomplete_utf8_suffix("\x80\x80") == 0);  // stray continuation bytes pass through
  CHECK(incomplete_utf8_suffix("\xff") == 0);
}
