// GBNF text to a grammar, and the errors that say where a grammar is wrong.
#include <catch2/catch.hpp>
#include <memory>

#include "grammar/gbnf.hpp"
#include "grammar/matcher.hpp"
#include "grammar/utf8_ranges.hpp"

using namespace troupe::grammar;

namespace {

std::shared_ptr<const CompiledGrammar> compiled(std::string_view text) {
  auto grammar = parse_gbnf(text);
  INFO((grammar ? std::string("parsed") : grammar.error().message));
  REQUIRE(grammar.has_value());
  auto c = compile(*grammar);
  INFO((c ? std::string("compiled") : c.error().message));
  REQUIRE(c.has_value());
  return std::make_shared<const CompiledGrammar>(std::move(*c));
}

// Whether the grammar matches all of `text` (and may end there).
bool matches(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  Matcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

std::string error_of(std::string_view text) {
  auto grammar = parse_gbnf(text);
  if (!grammar) return grammar.error().message;
  auto c = compile(*grammar);
  return c ? std::string() : c.error().message;
}

}  // namespace

TEST_CASE("a GBNF grammar matches exactly its language", "[grammar]") {
  const auto g = compiled(R"(
# a tiny JSON object of booleans
root ::= "{" ws ( pair ( "," ws pair )* )? "}"
pair ::= key ":" ws ( "true" | "false" ) ws
key  ::= "\"" [a-z_]+ "\""
ws   ::= [ \t\n]*
)");
  CHECK(matches(g, "{}"));
  CHECK(matches(g, "{ \"a\":true}"));
  CHECK(matches(g, "{\"is_on\": false ,\n \"b\":true}"));
  CHECK_FALSE(matches(g, "{\"a\":true,}"));
  CHECK_FALSE(matches(g, "{\"A\":true}"));
  CHECK_FALSE(matches(g, "{\"a\":true"));  // a prefix: alive, but cannot end
  Matcher m(g);
  REQUIRE(m.accept_bytes("{\"a\":t"));
  CHECK_FALSE(m.can_end());
  CHECK(m.next_bytes().count() == 1);
  CHECK(m.next_bytes().test('r'));
  CHECK_FALSE(m.accept_byte('x'));
  CHECK(m.accept_byte('r'));  // a rejected byte left the state as it was
}

TEST_CASE("repetitions, groups and any character", "[grammar]") {
  const auto g = compiled(R"(root ::= "a"{2,3} ( "b" | "cd" ){1,} "e"? . [0-9]{2})");
  CHECK(matches(g, "aabx12"));
  CHECK(matches(g,
                "aaacdbcde\xc3\xa9"
                "99"));                 // é is one character
  CHECK_FALSE(matches(g, "abx12"));     // one a
  CHECK_FALSE(matches(g, "aaaabx12"));  // four
  CHECK_FALSE(matches(g, "aax12"));     // no b or cd
  CHECK_FALSE(matches(g,
                      "aab\xc3"
                      "12"));  // half a character
  const auto exact = compiled(R"(root ::= [ab]{3})");
  CHECK(matches(exact, "aba"));
  CHECK_FALSE(matches(exact, "ab"));
  CHECK_FALSE(matches(exact, "abab"));
}

TEST_CASE("character classes work on code points, negated ones too", "[grammar]") {
  const auto g = compiled(R"(root ::= "\"" [^"\\\x00-\x1f]* "\"")");
  CHECK(matches(g, "\"plain\""));
  CHECK(matches(g, "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""));  // é € 😀
  CHECK_FALSE(matches(g, "\"a\"b\""));
  CHECK_FALSE(matches(g, "\"tab\there\""));
  CHECK_FALSE(matches(g, "\"\xc3\x28\""));      // an invalid UTF-8 sequence
  CHECK_FALSE(matches(g, "\"\xed\xa0\x80\""));  // a surrogate, which has no encoding
  const auto greek = compiled(R"(root ::= [α-ω]+ [\u00e9])");
  CHECK(matches(greek, "\xce\xb1\xcf\x89\xc3\xa9"));  // αωé
  CHECK_FALSE(matches(greek, "a\xc3\xa9"));
}

TEST_CASE("UTF-8 range sequences match every code point of the range and no other", "[grammar]") {
  for (const auto& [lo, hi] : {std::pair<std::uint32_t, std::uint32_t>{0x41, 0x7ff},
                               {0x7f, 0x10001},
                               {0xd000, 0xe100},
                               {0x1, 0x10ffff}}) {
    const auto sequences = utf8_sequences(lo, hi);
    for (std::uint32_t c = 0; c <= 0x10ffff; c += (c < 0x20000 ? 1 : 97)) {
      const std::string bytes = utf8_encode(c);
      int hits = 0;
      for (const auto& sequence : sequences) {
        if (sequence.size() != bytes.size()) continue;
        bool all = true;
        for (std::size_t i = 0; i < bytes.size(); ++i) {
          const auto b = static_cast<std::uint8_t>(bytes[i]);
          all = all && b >= sequence[i].first && b <= sequence[i].second;
        }
        hits += all ? 1 : 0;
      }
      const bool member = c >= lo && c <= hi && !(c >= 0xd800 && c <= 0xdfff);
      INFO("code point " << c << " in [" << lo << ", " << hi << "]");
      REQUIRE(hits == (member ? 1 : 0));
    }
  }
}

TEST_CASE("a wrong grammar is an error that says where and why", "[grammar]") {
  CHECK_THAT(error_of("root ::= \"abc"), Catch::Contains("1:") && Catch::Contains("unterminated"));
  CHECK_THAT(error_of("root ::= a\n"), Catch::Contains("'a' is used but never defined"));
  CHECK_THAT(error_of("start ::= \"a\""), Catch::Contains("no 'root' rule"));
  CHECK_THAT(error_of("root ::= root \"a\" | \"b\""), Catch::Contains("left-recursive"));
  CHECK_THAT(error_of("root ::= x\nx ::= y? x \"a\"\ny ::= \"b\""),
             Catch::Contains("left-recursive"));
  CHECK_THAT(error_of("root ::= \"a\"\n  \"b\" ::= \"c\""), Catch::Contains("2:"));
  CHECK_THAT(error_of("root ::= [z-a]"), Catch::Contains("backwards"));
  CHECK_THAT(error_of("root ::= \"\\q\""), Catch::Contains("unknown escape"));
  CHECK_THAT(error_of("root ::= \"a\"{3,2}"), Catch::Contains("below its minimum"));
  CHECK_THAT(error_of("root ::= \"a\"{5000}"), Catch::Contains("above 4096"));
  CHECK_THAT(error_of("root ::= (\"" + std::string(300, 'a') + "\"{4000}){4000}"),
             Catch::Contains("too large"));
  CHECK_THAT(error_of("root ::= ( \"a\""), Catch::Contains("expected ')'"));
  CHECK_THAT(error_of("root ::= \"a\"\nroot ::= \"b\""), Catch::Contains("defined twice"));
  CHECK_THAT(error_of("root ::= *"),
             Catch::Contains("nothing to repeat") || Catch::Contains("end of the line"));
  CHECK_THAT(error_of(std::string(100, '(')), Catch::Contains("rule name"));
  std::string many = "root ::= r0\n";
  for (int i = 0; i <= 20000; ++i) many += "r" + std::to_string(i) + " ::= \"x\"\n";
  CHECK_THAT(error_of(many), Catch::Contains("at most 20000"));
  CHECK_THAT(error_of("root ::= " + std::string(100, '(')), Catch::Contains("too deep"));
}

TEST_CASE("a surrogate or text that is not UTF-8 is refused, escaped or written", "[grammar]") {
  // A lone surrogate is no character: no UTF-8 output can hold one.
  CHECK_THAT(error_of(R"(root ::= "\uD800")"), Catch::Contains("U+D800 is a UTF-16 surrogate"));
  CHECK_THAT(error_of(R"(root ::= "\udfff")"), Catch::Contains("U+DFFF"));
  CHECK_THAT(error_of(R"(root ::= "\U0000D812")"), Catch::Contains("surrogate"));
  CHECK_THAT(error_of(R"(root ::= [\uD800-\uDFFF])"), Catch::Contains("surrogate"));
  CHECK_THAT(error_of(R"(root ::= [a-\uDBFF])"), Catch::Contains("surrogate"));
  // A pair written as two escapes is two surrogates, not the character they would make.
  CHECK_THAT(error_of(R"(root ::= "\uD83D\uDE00")"), Catch::Contains("surrogate"));
  // Written as raw bytes: a surrogate's three bytes, overlong forms, past U+10FFFF.
  CHECK_THAT(error_of("root ::= \"\xED\xA0\x80\""), Catch::Contains("invalid UTF-8"));
  CHECK_THAT(error_of("root ::= \"\xC0\xAF\""), Catch::Contains("invalid UTF-8"));
  CHECK_THAT(error_of("root ::= \"\xE0\x80\xAF\""), Catch::Contains("invalid UTF-8"));
  CHECK_THAT(error_of("root ::= \"\xF4\x90\x80\x80\""), Catch::Contains("invalid UTF-8"));
  // The characters around them are fine.
  CHECK(error_of(R"(root ::= "\uD7FF\uE000\U0001F600" [\u0080-\uD7FF])").empty());
  CHECK(matches(compiled("root ::= \"\xF0\x9F\x98\x80\""), "\xF0\x9F\x98\x80"));
}

TEST_CASE("repetitions keep the matcher's stacks flat however long they run", "[grammar]") {
  const auto g = compiled(R"(root ::= "\"" ( [^"\\] | "\\" ["\\n] )* "\"" [ ]*)");
  Matcher m(g);
  const auto deepest = [&] {
    std::size_t depth = 0;
    for (const auto& stack : m.stacks()) depth = std::max(depth, stack.size());
    return depth;
  };
  REQUIRE(m.accept_bytes("\"ab"));
  const std::size_t depth = deepest();
  for (int i = 0; i < 20000; ++i) REQUIRE(m.accept_bytes(i % 100 == 0 ? "\\n" : "x"));
  CHECK(deepest() == depth);
  REQUIRE(m.accept_bytes("\"   "));
  CHECK(m.can_end());
}

TEST_CASE("deep nesting and ambiguity are bounded, not a crash", "[grammar]") {
  const auto nested = compiled(R"(root ::= "[" root? "]")");
  Matcher m(nested);
  std::size_t accepted = 0;
  while (accepted < 5000 && m.accept_byte('[')) ++accepted;
  CHECK(accepted < 5000);  // stopped by the depth limit
  CHECK(accepted >= 1000);
  // Branches that multiply with every byte: refused once too many, never grown without end.
  const auto wide = compiled(R"g(root ::= x
x ::= "(" ( x | y | z | w ) ")" | "a"
y ::= "(" ( x | y | z | w ) ")" | "a"
z ::= "(" ( x | y | z | w ) ")" | "a"
w ::= "(" ( x | y | z | w ) ")" | "a")g");
  Matcher many(wide);
  std::size_t opened = 0;
  while (opened < 5000 && many.accept_byte('(')) ++opened;
  CHECK(opened < 16);  // 4^6 branches pass the limit of 4096
  // Branches that grow by one a byte, each as deep as where it switched (two positions a
  // level): after n bytes about n * n positions, so the positions' limit stops it near 510,
  // well before the branches' (4096) or the depth's (2048).
  const auto triangle = compiled(R"g(root ::= a
a ::= "(" a ")" | b
b ::= "(" b | "x")g");
  Matcher growing(triangle);
  opened = 0;
  while (opened < 5000 && growing.accept_byte('(')) ++opened;
  CHECK(opened > 400);
  CHECK(opened < 700);
  // A start with more distinct branches than allowed: the matcher says so, not a cut set.
  const auto optional_run = compiled(R"(root ::= ("a"?){0,4096} "b")");
  CHECK_FALSE(Matcher(optional_run).ok());
  const auto short_run = compiled(R"(root ::= ("a"?){0,100} "b")");
  Matcher fine(short_run);
  CHECK(fine.ok());
  CHECK(fine.accept_bytes("aab"));
  // A chain of rules entered before any byte: expanded by a work list, not the call stack.
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 3000; ++i) {
    chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " | \"x\"\n";
  }
  chain += "r3000 ::= \"y\"\n";
  const auto deep = compiled(chain);
  Matcher walker(deep);
  CHECK(walker.ok());
  CHECK(walker.accept_byte('y'));
  CHECK(walker.can_end());
  const auto ambiguous = compiled(R"(root ::= ( "a" | "a" "a" | "a" "a" "a" )*)");
  Matcher a(ambiguous);
  CHECK(a.accept_bytes(std::string(200, 'a')));
  CHECK(a.can_end());
}
