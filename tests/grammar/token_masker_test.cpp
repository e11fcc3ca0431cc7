// Token masks against the plain definition: a token is allowed when the matcher accepts
// all of its bytes from the current state.
#include <catch2/catch.hpp>
#include <memory>
#include <random>

#include "grammar/gbnf.hpp"
#include "grammar/token_masker.hpp"

using namespace troupe::grammar;

TEST_CASE("a token mask allows exactly the tokens the matcher accepts", "[grammar]") {
  auto grammar = parse_gbnf(R"(
root   ::= object
object ::= "{" ws ( member ( "," ws member )* )? "}" ws
member ::= string ":" ws value
value  ::= object | string | number | "true" | "false" | "null"
string ::= "\"" ( [^"\\] | "\\" ["\\nt] )* "\"" ws
number ::= "-"? [0-9]+ ( "." [0-9]+ )? ws
ws     ::= [ \n]*
)");
  REQUIRE(grammar.has_value());
  auto compiled = compile(*grammar);
  REQUIRE(compiled.has_value());
  const auto g = std::make_shared<const CompiledGrammar>(std::move(*compiled));
  // A vocabulary of pieces that matter here, random runs of them, and an empty (special) one.
  const std::vector<std::string> pieces = {"{",    "}",     "\"",   ":",  ",", " ",
                                           "\n",   "a",     "b",    "1",  "-", ".",
                                           "true", "false", "null", "\\", "n", "\xc3\xa9"};
  std::mt19937 rng(11);
  std::vector<std::string> vocab = {""};
  vocab.insert(vocab.end(), pieces.begin(), pieces.end());
  std::uniform_int_distribution<std::size_t> pick(0, pieces.size() - 1), length(2, 4);
  for (int i = 0; i < 600; ++i) {
    std::string token;
    for (std::size_t n = length(rng); n > 0; --n) token += pieces[pick(rng)];
    vocab.push_back(token);
  }
  const TokenMasker masker(vocab);
  // Walk a few random valid outputs, checking the mask at every step.
  for (int walk = 0; walk < 5; ++walk) {
    Matcher m(g);
    for (int step = 0; step < 40; ++step) {
      std::vector<std::uint64_t> mask;
      masker.fill_mask(m, mask);
      std::vector<std::size_t> allowed;
      for (std::size_t id = 0; id < vocab.size(); ++id) {
        Matcher probe = m;
        const bool want = !vocab[id].empty() && probe.accept_bytes(vocab[id]);
        const bool got = (mask[id / 64] >> (id % 64) & 1) != 0;
        INFO("walk " << walk << ", step " << step << ", token '" << vocab[id] << "'");
        REQUIRE(got == want);
        if (want) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      std::uniform_int_distribution<std::size_t> choose(0, allowed.size() - 1);
      REQUIRE(m.accept_bytes(vocab[allowed[choose(rng)]]));
    }
  }
}
