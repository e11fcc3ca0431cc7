#include <catch2/catch.hpp>

#include "text/pre_tokenizer.hpp"
#include "text/unicode.hpp"

using namespace troupe;
using namespace troupe::text;

namespace {

std::vector<std::string> words(PreTokenizer pre, std::string_view text) {
  std::vector<std::string> out;
  for (auto w : pre_tokenize(pre, text)) out.emplace_back(w);
  return out;
}

using W = std::vector<std::string>;

}  // namespace

TEST_CASE("Unicode categories and white space come from the tables", "[unicode]") {
  CHECK(unicode_category(U'a') == kLetter);
  CHECK(unicode_category(U'\u00e9') == kLetter);
  CHECK(unicode_category(U'\u65e5') == kLetter);  // 日
  CHECK(unicode_category(U'7') == kNumber);
  CHECK(unicode_category(U'\u0663') == kNumber);  // Arabic-Indic three
  CHECK(unicode_category(U',') == kPunctuation);
  CHECK(unicode_category(U'$') == kSymbol);
  CHECK(unicode_category(U'\U0001F999') == kSymbol);  // 🦙
  CHECK(unicode_category(U'\u0301') == kMark);
  CHECK(unicode_category(0x0378) == kUndefined);
  CHECK(is_unicode_whitespace(U'\u3000'));
  CHECK_FALSE(is_unicode_whitespace(U'\u200b'));
}

TEST_CASE("decode_utf8 keeps every byte, invalid ones as U+FFFD of one byte", "[unicode]") {
  const auto chars = decode_utf8("a\xc3\xa9\xff\xe2\x82");
  REQUIRE(chars.size() == 5);
  CHECK(chars[1].cp == 0xE9);
  CHECK(chars[1].length == 2);
  CHECK(chars[2].cp == 0xFFFD);
  CHECK(chars[2].length == 1);
  CHECK(chars[3].offset == 4);  // a truncated sequence: each of its bytes alone
  CHECK(chars[4].offset == 5);
  CHECK(chars[4].length == 1);
}

TEST_CASE("the GPT-2 split: contractions, letters, numbers, others, spaces", "[pre_tokenizer]") {
  CHECK(words(PreTokenizer::gpt2, "Hello world  123 it's!!\n\n x") ==
        W{"Hello", " world", " ", " 123", " it", "'s", "!!", "\n\n", " x"});
  CHECK(words(PreTokenizer::gpt2, "   ") == W{"   "});
  CHECK(words(PreTokenizer::gpt2, "IT'S") == W{"IT", "'", "S"});  // case-sensitive
}

TEST_CASE("the Llama-3 split: case-free contractions, 3-digit numbers, newline runs",
          "[pre_tokenizer]") {
  CHECK(words(PreTokenizer::llama3, "Hello world  123456 IT'S\n\n  x") ==
        W{"Hello", " world", " ", " ", "123", "456", " IT", "'S", "\n\n", " ", " x"});
  CHECK(words(PreTokenizer::llama3, "(hello)") == W{"(hello", ")"});
  CHECK(words(PreTokenizer::llama3, "a ...\n\nb") == W{"a", " ...\n\n", "b"});
}

TEST_CASE("the Qwen2 split takes digits one by one", "[pre_tokenizer]") {
  CHECK(words(PreTokenizer::qwen2, "x 2024") == W{"x", " ", "2", "0", "2", "4"});
}

TEST_CASE("the StarCoder split isolates digits before the GPT-2 split", "[pre_tokenizer]") {
  CHECK(words(PreTokenizer::starcoder, "a12 b") == W{"a", "1", "2", " b"});
}

TEST_CASE("the Falcon split groups punctuation and cuts 3-digit runs", "[pre_tokenizer]") {
  CHECK(words(PreTokenizer::falcon, "x+=1234;") == W{"x", "+=", "123", "4", ";"});
}

TEST_CASE("the DeepSeek-Coder split", "[pre_tokenizer]") {
  CHECK(words(PreTokenizer::deepseek_coder, "def f():\n  return 42") ==
        W{"def", " f", "():", "\n", " ", " return", " ", "4", "2"});
}

TEST_CASE("words always cover the text, byte for byte", "[pre_tokenizer]") {
  const std::string text = "caf\xc3\xa9 \xff\xfe 12,345 \xf0\x9f\xa6\x99\r\n\t'll";
  for (auto pre : {PreTokenizer::gpt2, PreTokenizer::llama3, PreTokenizer::qwen2,
                   PreTokenizer::starcoder, PreTokenizer::falcon, PreTokenizer::deepseek_coder}) {
    std::string joined;
    for (const auto& w : words(pre, text)) {
      CHECK_FALSE(w.empty());
      joined += w;
    }
    CHECK(joined == text);
  }
}

TEST_CASE("pre-tokenizer names follow llama.cpp, unknown ones are errors", "[pre_tokenizer]") {
  CHECK(*pre_tokenizer_from_name("llama-bpe") == PreTokenizer::llama3);
  CHECK(*pre_tokenizer_from_name("gpt-2") == PreTokenizer::gpt2);
  CHECK(*pre_tokenizer_from_name("deepseek-coder") == PreTokenizer::deepseek_coder);
  const auto unknown = pre_tokenizer_from_name("klingon");
  REQUIRE_FALSE(unknown.has_value());
  CHECK(unknown.error().message ==
        "tokenizer.ggml.pre 'klingon' is not a pre-tokenizer troupe knows");
}

TEST_CASE("to_valid_utf8 replaces only the invalid bytes", "[unicode]") {
  CHECK(to_valid_utf8("caf\xc3\xa9") == "caf\xc3\xa9");
  CHECK(to_valid_utf8("a\xff"
                      "b") ==
        "a\xef\xbf\xbd"
        "b");
  CHECK(to_valid_utf8("\xe2\x82") == "\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(to_valid_utf8("\xed\xa0\x80") == "\xef\xbf\xbd");  // a surrogate is not UTF-8
  // Overlong forms and code points past U+10FFFF are not UTF-8 either (JSON parsers refuse
  // them): found by the HTTP fuzz target in a 404's quoted path.
  CHECK(to_valid_utf8("\xc0\x93") == "\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(to_valid_utf8("\xe0\x80\xaf") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(to_valid_utf8("\xf4\x90\x80\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(to_valid_utf8("\xf4\x8f\xbf\xbf") == "\xf4\x8f\xbf\xbf");  // U+10FFFF itself
  CHECK(to_valid_utf8("\xef\xbf\xbd") == "\xef\xbf\xbd");          // a real U+FFFD stays
}
