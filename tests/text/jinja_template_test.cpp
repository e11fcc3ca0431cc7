// The Jinja interpreter's features one by one, each against the exact text jinja2
// renders (with trim_blocks and lstrip_blocks, as Hugging Face sets it up).
#include <catch2/catch.hpp>
#include <string>

#include "text/jinja/template.hpp"

namespace {

namespace jinja = troupe::text::jinja;
using jinja::Dict;
using jinja::List;
using jinja::Value;

Value object(std::initializer_list<std::pair<std::string, Value>> items) {
  Dict d;
  for (const auto& [k, v] : items) d.set(k, v);
  return d;
}

// The rendered text, or "error: <message>".
std::string render(const std::string& source, const Value& variables = Dict{}) {
  const auto t = jinja::Template::parse(source);
  if (!t) return "error: " + t.error().message;
  jinja::RenderOptions options;
  options.now = [] {
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    return tm;
  };
  const auto out = t->render(variables.as_dict(), options);
  return out ? *out : "error: " + out.error().message;
}

}  // namespace

TEST_CASE("text and printed expressions render as jinja2 prints them", "[text][jinja]") {
  CHECK(render("Hello {{ name }}!", object({{"name", "world"}})) == "Hello world!");
  CHECK(render("{{ 1 }} {{ 2.5 }} {{ 1.0 }} {{ true }} {{ none }} {{ 'a' ~ 1 }}") ==
        "1 2.5 1.0 True None a1");
  CHECK(render("{{ [1, 'a', none, false] }} {{ {'k': \"it's\"} }}") ==
        "[1, 'a', None, False] {'k': \"it's\"}");
  CHECK(render("{{ 1e20 }} {{ 0.0001 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}") ==
        "1e+20 0.0001 2.5 3 2 1024");
  CHECK(render("{{ 'a' + 'b' ~ 'c' }} {{ 1 + 2 * 3 }} {{ -2 ** 2 }} {{ (1 + 2) * 3 }}") ==
        "abc 7 4 9");
  CHECK(render("{{ 'line\\nbreak\\t\\u00e9' }}") == "line\nbreak\t\xc3\xa9");
}

TEST_CASE("whitespace control, trim_blocks and lstrip_blocks shape the output", "[text][jinja]") {
  CHECK(render("a  {{- ' b ' -}}  c") == "a b c");
  CHECK(render("{% if true %}\nyes\n{% endif %}\nafter") == "yes\nafter");
  CHECK(render("start\n    {% if true %}\n    inside\n    {% endif %}\nend") ==
        "start\n    inside\nend");
  CHECK(render("x {%+ if true %}y{% endif %}") == "x y");
  CHECK(render("a\n{# a comment #}\nb\n{#- gone -#}\n c") == "a\nbc");
  CHECK(render("text\n") == "text");
  CHECK(render("{{ 'x' }}\n{{ 'y' }}") == "x\ny");
}

TEST_CASE("if, elif and else pick the first true branch", "[text][jinja]") {
  const std::string t = "{% if n > 1 %}many{% elif n == 1 %}one{% else %}none{% endif %}";
  CHECK(render(t, object({{"n", 3}})) == "many");
  CHECK(render(t, object({{"n", 1}})) == "one");
  CHECK(render(t, object({{"n", 0}})) == "none");
  CHECK(render("{{ 'yes' if x else 'no' }}{{ 'shown' if false }}", object({{"x", List{}}})) ==
        "no");
}

TEST_CASE("for loops know their place and honour break, continue, else and filters",
          "[text][jinja]") {
  CHECK(render("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
               "{{ x }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}") ==
        "103aTrueFalse3;212bFalseFalse3;321cFalseTrue3;");
  CHECK(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
               "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}") == "013");
  CHECK(render("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for x in range(4) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}") == "abca");
  CHECK(render("{% for x in range(6) if x is odd %}{{ x }}/{{ loop.length }} {% endfor %}") ==
        "1/3 3/3 5/3 ");
  CHECK(render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}",
               object({{"d", object({{"b", 1}, {"a", 2}})}})) == "b=1,a=2,");
  CHECK(render("{% for k in d %}{{ k }}{% endfor %}",
               object({{"d", object({{"x", 1}, {"y", 2}})}})) == "xy");
}

TEST_CASE("set is scoped to a loop turn and namespace() carries state out of loops",
          "[text][jinja]") {
  CHECK(render("{% set x = 1 %}{% for i in range(3) %}{% if i == 1 %}{% set x = 2 %}{% endif %}"
               "[{{ x }}]{% endfor %}{{ x }}") == "[1][2][1]1");
  CHECK(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
               "{% endfor %}{{ ns.n }}") == "6");
  CHECK(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}") == "21");
  CHECK(render("{% set block %}in {{ 'a block' }}{% endset %}[{{ block }}]") == "[in a block]");
}

TEST_CASE("macros take arguments and defaults and return their output", "[text][jinja]") {
  CHECK(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
               "{{ greet('Ann') }} {{ greet('Bo', punct='?') }}") == "Hi Ann! Hi Bo?");
}

TEST_CASE("attributes, subscripts and slices reach into values", "[text][jinja]") {
  const Value v =
      object({{"m", List{object({{"role", "user"}}), object({{"role", "tool"}})}}, {"s", "héllo"}});
  CHECK(render("{{ m[0].role }} {{ m[-1]['role'] }} {{ m[5] }}|{{ m[0].missing }}|", v) ==
        "user tool ||");
  CHECK(render("{{ s[::-1] }} {{ s[1:] }} {{ s[:-1] }} {{ m[1:] | length }} {{ s[1] }}", v) ==
        "olléh éllo héll 1 é");
  CHECK(render("{{ [1, 2, 3, 4][::2] }} {{ [1, 2, 3][-2:] }}") == "[1, 3] [2, 3]");
}

TEST_CASE("undefined values print nothing, are false and fail when used", "[text][jinja]") {
  CHECK(render("[{{ nothing }}]{{ nothing is defined }}{{ nothing is undefined }}"
               "{{ not nothing }}{{ nothing | length }}") == "[]FalseTrueTrue0");
  CHECK(render("{% for x in nothing %}x{% endfor %}{{ 'a' in nothing }}") == "False");
  CHECK(render("{{ nothing.attribute }}").starts_with("error: chat template error at line 1"));
  CHECK(render("{{ 'a' + nothing }}") ==
        "error: chat template error at line 1, column 8: 'nothing' is undefined");
}

TEST_CASE("comparisons, logic, membership and tests answer as Python does", "[text][jinja]") {
  CHECK(render("{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ 2 < 3 }}{{ 'b' >= 'a' }}{{ not 0 }}"
               "{{ 0 or 'x' }}{{ 1 and 2 }}") == "TrueTrueTrueTrueTruex2");
  CHECK(render("{{ 'ell' in 'hello' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': none} }}"
               "{{ 3 not in [1] }}") == "TrueTrueTrueTrue");
  CHECK(render(
            "{{ 'x' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 'x' is sequence }}"
            "{{ 1 is number }}{{ 1 is integer }}{{ 1.5 is integer }}{{ true is boolean }}"
            "{{ true is true }}{{ 0 is false }}{{ 3 is odd }}{{ 4 is even }}"
            "{{ none is none }}{{ 1 is not none }}{{ 5 is equalto 5 }}{{ 6 is divisibleby(3) }}") ==
        "TrueTrueTrueTrueTrueTrueFalseTrueTrueFalseTrueTrueTrueTrueTrueTrue");
}

TEST_CASE("filters transform values as jinja2's do", "[text][jinja]") {
  const Value v = object({{"people", List{object({{"name", "ann"}, {"age", 30}}),
                                          object({{"name", "bo"}, {"age", 20}})}}});
  CHECK(render("{{ '  x  ' | trim }}|{{ 'abc' | length }}|{{ [3, 1] | first }}{{ [3, 1] | last }}|"
               "{{ 'hi you' | upper }}|{{ 'HI' | lower }}|{{ 'hello world' | capitalize }}|"
               "{{ 'hello world' | title }}|{{ 'aXa' | replace('a', 'b') }}") ==
        "x|3|31|HI YOU|hi|Hello world|Hello World|bXb");
  CHECK(render("{{ people | map(attribute='name') | join(', ') }}|"
               "{{ people | selectattr('age', 'gt', 25) | map(attribute='name') | list }}|"
               "{{ people | rejectattr('name', 'equalto', 'ann') | list | length }}|"
               "{{ people | sort(attribute='age') | map(attribute='name') | join }}",
               v) == "ann, bo|['ann']|1|boann");
  CHECK(render("{{ [1, 2, 3, 4] | select('even') | list }}{{ ['a', 'b'] | reject('equalto', 'a') "
               "| list }}{{ [3, 1, 3] | unique | list }}{{ [1, 2] | reverse | list }}"
               "{{ [2, 1] | sort }}") == "[2, 4]['b'][3, 1][2, 1][1, 2]");
  CHECK(render("{{ '42' | int + 1 }} {{ 'x' | int }} {{ '2.5' | float }} {{ -3 | abs }} "
               "{{ 2.567 | round(2) }} {{ 7 | string ~ '!' }} {{ x | default('dflt') }} "
               "{{ '' | default('e', true) }}") == "43 0 2.5 3 2.57 7! dflt e");
  CHECK(render("{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}{{ v }}{% endfor %} "
               "{% for k, v in {'a': 1} | items %}{{ k }}{{ v }}{% endfor %}") == "a2b1 a1");
  CHECK(render("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}") ==
        "a\n  b\n\n  c|  a\n  b");
}

TEST_CASE("tojson writes JSON as Hugging Face's filter does", "[text][jinja]") {
  const Value v = object(
      {{"d",
        object({{"name", "é \"q\"\n"}, {"n", List{1, 2.0, true, nullptr}}, {"empty", List{}}})}});
  CHECK(render("{{ d | tojson }}", v) ==
        "{\"name\": \"é \\\"q\\\"\\n\", \"n\": [1, 2.0, true, null], \"empty\": []}");
  CHECK(render("{{ d | tojson(indent=2) }}", v) ==
        "{\n  \"name\": \"é \\\"q\\\"\\n\",\n  \"n\": [\n    1,\n    2.0,\n    true,\n    null\n  "
        "],\n  \"empty\": []\n}");
  CHECK(render("{{ {'b': 1, 'a': 2} | tojson(separators=(',', ':'), sort_keys=true) }}") ==
        "{\"a\":2,\"b\":1}");
}

TEST_CASE("string and dict methods work as Python's", "[text][jinja]") {
  CHECK(
      render(
          "{{ '  a b  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'a,b,,c'.split(',') }}|"
          "{{ ' a  b '.split() }}|{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'o')) }}|"
          "{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ 'a-a'.replace('a', 'b', 1) }}") ==
      "a b|axx|['a', 'b', '', 'c']|['a', 'b']|TrueTrue|ABab|b-a");
  CHECK(render("{{ d.get('a') }} {{ d.get('z', 0) }} {{ d.get('z') }} {{ d.keys() | list }} "
               "{{ d.values() | list }}",
               object({{"d", object({{"a", 1}})}})) == "1 0 None ['a'] [1]");
}

TEST_CASE("raise_exception's message is the error, and strftime_now reads the given clock",
          "[text][jinja]") {
  CHECK(render("before{{ raise_exception('No system role, please') }}") ==
        "error: No system role, please");
  CHECK(render("{{ strftime_now('%d %b %Y') }}") == "26 Jul 2024");
}

TEST_CASE("syntax errors are values that say where", "[text][jinja]") {
  CHECK(render("ok\n{% if x %}never closed") ==
        "error: chat template syntax error at line 2, column 23: the template ends inside a "
        "block: expected 'elif'");
  CHECK(render("{{ 1 + }}") ==
        "error: chat template syntax error at line 1, column 8: unexpected '}}'");
  CHECK(render("{% frobnicate %}") ==
        "error: chat template syntax error at line 1, column 4: unknown or unsupported tag "
        "'frobnicate'");
  CHECK(render("{{ 'open") ==
        "error: chat template syntax error at line 1, column 4: the string is never closed");
  CHECK(render("{% for x in y %}").starts_with("error: chat template syntax error"));
}

TEST_CASE("hostile templates fail with an error instead of exhausting the machine",
          "[text][jinja]") {
  CHECK(render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
            .starts_with("error: chat template syntax error at line 1"));
  CHECK(
      render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}") ==
      "error: chat template error at line 1, column 32: the template runs too long");
  CHECK(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}")
            .ends_with("macros call each other too deeply"));
  CHECK(render("{{ 'x' * 100000000 }}").ends_with("a repeated sequence would be too long"));
  CHECK(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}")
            .ends_with("a value nests too deeply"));
  CHECK(render("{{ 1 // 0 }}").ends_with("integer division or modulo by zero"));
}

TEST_CASE("a dict keeps insertion order and finds keys whatever its size", "[text][jinja]") {
  // Past a few keys lookups go through an index (10^5 keys used to cost 10^10 compares).
  Dict d;
  for (int i = 0; i < 100'000; ++i) d.set("k" + std::to_string(i), Value(std::int64_t{i}));
  REQUIRE(d.items.size() == 100'000);
  CHECK(d.find("k99999")->as_int() == 99'999);
  CHECK(d.find("k0")->as_int() == 0);
  CHECK(d.find("missing") == nullptr);
  d.set("k5", Value(std::string("five")));  // replaced in place: order kept
  CHECK(d.items[5].first == "k5");
  CHECK(d.items[5].second.as_string() == "five");
  CHECK(d.items.size() == 100'000);
  d.clear();
  CHECK(d.find("k5") == nullptr);
  d.set("a", Value(std::int64_t{1}));
  CHECK(d.find("a")->as_int() == 1);
  // A small dict, built from a list, then grown past the index's threshold.
  Dict small({{"x", Value(std::int64_t{1})}, {"y", Value(std::int64_t{2})}});
  for (int i = 0; i < 40; ++i) small.set("z" + std::to_string(i), Value(std::int64_t{i}));
  CHECK(small.find("y")->as_int() == 2);
  CHECK(small.find("z39")->as_int() == 39);
  CHECK(small.items.front().first == "x");
}
