// Regular expressions and choices as grammars: what they match (full matches, as
// re.fullmatch), and what they refuse.
#include <catch2/catch.hpp>
#include <memory>

#include "grammar/matcher.hpp"
#include "grammar/regex.hpp"

using namespace troupe::grammar;

namespace {

std::shared_ptr<const CompiledGrammar> from_regex(std::string_view regex) {
  auto grammar = parse_regex(regex);
  INFO(regex << ": " << (grammar ? std::string("ok") : grammar.error().message));
  REQUIRE(grammar.has_value());
  auto compiled = compile(*grammar);
  REQUIRE(compiled.has_value());
  return std::make_shared<const CompiledGrammar>(std::move(*compiled));
}

bool full_match(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  Matcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

std::string error_of(std::string_view regex) {
  auto grammar = parse_regex(regex);
  return grammar ? std::string() : grammar.error().message;
}

}  // namespace

TEST_CASE("a regex grammar matches what the regex fully matches", "[grammar]") {
  struct Case {
    const char* regex;
    std::vector<const char*> yes, no;
  };
  const std::vector<Case> cases = {
      {R"(^\d{3}-\d{4}$)", {"555-1234"}, {"5551234", "555-12345", "55-1234"}},
      {R"([A-Z][a-z]+(?: [A-Z][a-z]+)*)", {"Ada", "Ada Lovelace"}, {"ada", "Ada ", "A"}},
      {R"((cat|dog)s?)", {"cat", "dogs"}, {"cow", "cats!"}},
      {R"(\w+@\w+\.(com|org))", {"me@site.org", "a_1@b.com"}, {"me@site.net", "@b.com"}},
      {R"([^\s,]+(,[^\s,]+)*)", {"a,b,c", "x"}, {"a, b", "a,,b", ""}},
      {R"(a.c)",
       {"abc", "a-c",
        "a\xc3\xa9"
        "c"},
       {"a\nc", "ac"}},
      {R"(\(\d+\.\d*\)\?)", {"(12.5)?", "(1.)?"}, {"(1)?", "12.5"}},
      {R"(x{2,}y{0,2}z?)", {"xx", "xxxyyz"}, {"x", "xxyyy"}},
      {R"((?P<year>\d{4})-(?<month>0[1-9]|1[0-2]))", {"2026-12"}, {"2026-13", "26-12"}},
      {R"(caf[eé]+ ok)", {"cafe ok", "caf\xc3\xa9\xc3\xa9 ok"}, {"caf ok"}},
      {R"([\d\-+]+|[a-f-]+)", {"+1-2", "a-f"}, {"+a"}},
      {R"(a*?b+?c??)", {"b", "aabbc"}, {"ac"}},
      {R"()", {""}, {"a"}},
  };
  for (const Case& c : cases) {
    const auto g = from_regex(c.regex);
    for (const char* text : c.yes) {
      INFO(c.regex << " should match '" << text << "'");
      CHECK(full_match(g, text));
    }
    for (const char* text : c.no) {
      INFO(c.regex << " should not match '" << text << "'");
      CHECK_FALSE(full_match(g, text));
    }
  }
}

TEST_CASE("what a regex grammar cannot express is refused with a reason", "[grammar]") {
  CHECK_THAT(error_of(R"(a(?=b))"), Catch::Contains("lookaround"));
  CHECK_THAT(error_of(R"((a)\1)"), Catch::Contains("backreferences"));
  CHECK_THAT(error_of(R"(a^b)"), Catch::Contains("anchors"));
  CHECK_THAT(error_of(R"(\bword)"), Catch::Contains("word boundaries"));
  CHECK_THAT(error_of(R"((ab)"), Catch::Contains("missing ')'"));
  CHECK_THAT(error_of(R"(ab))"), Catch::Contains("unbalanced"));
  CHECK_THAT(error_of(R"([abc)"), Catch::Contains("unterminated"));
  CHECK_THAT(error_of(R"(*a)"), Catch::Contains("nothing to repeat"));
  CHECK_THAT(error_of(R"(a**)"), Catch::Contains("after a quantifier"));
  CHECK_THAT(error_of(R"([\D])"), Catch::Contains("negated shorthand"));
  CHECK_THAT(error_of(R"(\q)"), Catch::Contains("unknown escape"));
  CHECK_THAT(error_of("a{3,1}"), Catch::Contains("below its minimum"));
  // Nesting: refused by the regex's own count, never by a deep stack, and the GBNF of any
  // regex within the count parses (a quantified group is two levels of it).
  auto nested = [](int depth) {
    std::string regex;
    for (int i = 0; i < depth; ++i) regex += "(";
    regex += "a";
    for (int i = 0; i < depth; ++i) regex += ")*";
    return regex;
  };
  CHECK(error_of(nested(30)).empty());
  CHECK_THAT(error_of(nested(40)), Catch::Contains("nested too deep"));
  CHECK_THAT(error_of(nested(100'000)), Catch::Contains("nested too deep"));
  CHECK_THAT(error_of(std::string(100'000, '(')), Catch::Contains("nested too deep"));
}

TEST_CASE("a choice grammar matches exactly one of its strings", "[grammar]") {
  auto grammar = parse_choice({"yes", "no", "maybe \"so\"", "caf\xc3\xa9"});
  REQUIRE(grammar.has_value());
  auto compiled = compile(*grammar);
  REQUIRE(compiled.has_value());
  const auto g = std::make_shared<const CompiledGrammar>(std::move(*compiled));
  CHECK(full_match(g, "yes"));
  CHECK(full_match(g, "maybe \"so\""));
  CHECK(full_match(g, "caf\xc3\xa9"));
  CHECK_FALSE(full_match(g, "ye"));
  CHECK_FALSE(full_match(g, "yesno"));
  CHECK_FALSE(parse_choice({}).has_value());
}
