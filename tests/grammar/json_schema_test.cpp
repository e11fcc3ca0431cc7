// JSON schemas as grammars: documents drawn at random from each schema's grammar must parse
// as JSON and validate against the schema (checked by Python's jsonschema where it is
// installed, and by hand-written documents the grammar must refuse everywhere).
#include <boost/json.hpp>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include "grammar/gbnf.hpp"
#include "grammar/json_schema.hpp"
#include "grammar/matcher.hpp"
#include "support/test_support.hpp"

using namespace troupe::grammar;
namespace json = boost::json;

namespace {

struct SchemaCase {
  const char* schema;
  std::vector<const char*> invalid;  // documents the grammar must refuse
};

// At least one case per supported keyword.
const std::vector<SchemaCase> kCases = {
    {R"({"type": "string"})", {"1", "\"a", "'a'"}},
    {R"({"type": "integer"})", {"1.5", "01", "\"1\"", "-"}},
    {R"({"type": "number"})", {"1.", ".5", "1e", "NaN"}},
    {R"({"type": "boolean"})", {"True", "1"}},
    {R"({"type": "null"})", {"nul", "None"}},
    {R"({"type": ["integer", "null"]})", {"1.5", "\"x\""}},
    {R"({"enum": ["red", "green", 3, null, true]})", {"\"blue\"", "4", "false"}},
    {R"({"type": ["string", "null"], "enum": ["red", 3, null, true, 2.5]})", {"3", "true", "2.5"}},
    {R"({"type": "integer", "enum": ["1", 1, 2.0, 2.5]})", {"\"1\"", "2.5"}},
    {R"({"const": {"a": [1, 2]}})", {"{\"a\":[1]}", "{\"a\":[1,2,3]}"}},
    {R"({"type": "string", "minLength": 2, "maxLength": 4})", {"\"a\"", "\"abcde\""}},
    {R"({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"})", {"\"AB-12\"", "\"ab-123\""}},
    {R"({"type": "string", "pattern": "^.+$"})", {"\"\"", "\"a\"b\"", "\"a\\\""}},
    {R"({"type": "string", "pattern": "[0-9]{3}"})", {"\"ab12\"", "\"\""}},
    {R"({"type": "string", "pattern": "^[^x]*(ab|c)$"})", {"\"xab\"", "\"q\"c\""}},
    {R"({"type": "string", "format": "date"})", {"\"2026-13-01\"", "\"26-01-01\""}},
    {R"({"type": "string", "format": "date-time"})", {"\"2026-12-01 10:00:00Z\""}},
    {R"({"type": "string", "format": "uuid"})", {"\"1234\""}},
    {R"({"type": "string", "format": "email"})", {"1", "\"a@\"", "\"@b.com\""}},
    {R"({"type": "string", "format": "ipv4"})", {"\"256.1.1.1\"", "\"1.2.3\""}},
    {R"({"type": "string", "format": "date"})", {"\"2026-02-30\"", "\"2026-04-31\""}},
    {R"({"type": "integer", "minimum": 5, "maximum": 123})", {"4", "124", "-5", "1000"}},
    {R"({"type": "integer", "exclusiveMinimum": -20, "exclusiveMaximum": -3})",
     {"-20", "-3", "0", "-21"}},
    {R"({"type": "integer", "minimum": 100})", {"99", "-100", "0"}},
    {R"({"type": "integer", "maximum": -7})", {"-6", "0", "7"}},
    {R"({"type": "number", "minimum": 0})", {"-1", "-0.5"}},
    {R"({"type": "number", "exclusiveMinimum": 0})", {"0", "0.000", "0e5", "-1", "-0.5"}},
    {R"({"type": "array", "items": {"type": "integer"}})", {"[1,]", "[\"a\"]", "[1 2]"}},
    {R"({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3})",
     {"[]", "[true]", "[true,true,true,true]"}},
    {R"({"type": "array", "maxItems": 0})", {"[1]"}},
    {R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})",
     {"[1,\"a\"]", "[\"a\",1,2]"}},
    {R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": false})",
     {"{\"name\":\"a\"}", "{\"age\":1,\"name\":\"a\"}", "{\"name\":\"a\",\"age\":1,\"x\":1}"}},
    {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
        "c": {"type": "boolean"}}, "additionalProperties": false})",
     {"{,}", "{\"a\":1,}", "{\"d\":1}", "{\"a\":\"x\"}"}},
    {R"({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})",
     {"{}", "{\"x\":1}"}},
    {R"({"type": "object", "additionalProperties": {"type": "number"}})",
     {"{\"a\":\"b\"}", "{\"a\":}"}},
    {R"({"type": "object", "required": ["x"], "additionalProperties": {"type": "boolean"}})",
     {"{}", "{\"x\":1}", "{\"x\":true,\"y\":1}"}},
    {R"({"type": "object"})", {"[]", "{\"a\"}"}},
    {R"({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]})",
     {"1", "[\"a\"]"}},
    {R"({"oneOf": [{"const": 1}, {"const": "one"}]})", {"2", "\"two\""}},
    {R"({"allOf": [{"type": "integer", "maximum": 9, "minimum": 0}]})", {"10", "-1"}},
    {R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
        "required": ["value", "next"], "additionalProperties": false}},
        "$ref": "#/$defs/node"})",
     {"{\"value\":1}", "{\"value\":1,\"next\":{\"value\":2}}"}},
    {R"({"definitions": {"tag": {"type": "string", "maxLength": 3}},
        "type": "array", "items": {"$ref": "#/definitions/tag"}})",
     {"[\"abcd\"]", "[1]"}},
    {R"({"title": "Weather", "description": "a call", "type": "object",
        "properties": {"city": {"type": "string", "description": "where"},
                       "unit": {"enum": ["c", "f"], "default": "c"}},
        "required": ["city"], "additionalProperties": false})",
     {"{\"unit\":\"c\"}", "{\"city\":\"x\",\"unit\":\"k\"}"}},
    {R"(true)", {"{", "tru"}},
};

std::shared_ptr<const CompiledGrammar> grammar_of(const char* schema_text) {
  const json::value schema = json::parse(schema_text);
  auto grammar = parse_json_schema(schema);
  INFO(schema_text << "\n" << (grammar ? std::string() : grammar.error().message));
  REQUIRE(grammar.has_value());
  auto compiled = compile(*grammar);
  INFO((compiled ? std::string() : compiled.error().message));
  REQUIRE(compiled.has_value());
  return std::make_shared<const CompiledGrammar>(std::move(*compiled));
}

// A document drawn from the grammar: random allowed bytes, mostly printable ASCII, until the
// grammar may end and a coin says stop; past a length, bytes that tend to close.
std::string draw(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng) {
  static const std::string kClosing = "\"}]0123456789truefalsn,:-T.Z";
  Matcher m(g);
  std::string out;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  while (true) {
    if (m.can_end() && (coin(rng) < 0.2 || out.size() > 200)) return out;
    const ByteSet next = m.next_bytes();
    if (next.none()) {  // nothing may follow: a live state is then complete
      REQUIRE(m.can_end());
      return out;
    }
    std::vector<int> options;
    if (out.size() > 120) {  // bytes that tend to close what is open, the quote most
      for (const char c : kClosing) {
        if (next.test(static_cast<unsigned char>(c)))
          options.push_back(static_cast<unsigned char>(c));
      }
      if (!options.empty() && options.front() == '"' && coin(rng) < 0.5) options.resize(1);
      if (coin(rng) < 0.3) options.clear();  // now and then any byte (a pattern's letters)
    }
    if (options.empty()) {
      for (int b = 0x20; b < 0x7f; ++b) {
        if (next.test(b)) options.push_back(b);
      }
    }
    if (options.empty() || coin(rng) < 0.02) {
      for (int b = 0; b < 256; ++b) {
        if (next.test(b)) options.push_back(b);
      }
    }
    std::uniform_int_distribution<std::size_t> pick(0, options.size() - 1);
    const auto byte = static_cast<std::uint8_t>(options[pick(rng)]);
    REQUIRE(m.accept_byte(byte));
    out += static_cast<char>(byte);
    REQUIRE(out.size() < 4000);
  }
}

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  Matcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

using troupe::test::kPython;

// Whether python3 with jsonschema is here (the validator the cross-check uses).
bool have_jsonschema() {
  return troupe::test::python_has("jsonschema");
}

// 25 documents drawn from each case's grammar, each checked to be JSON, and each case's
// invalid documents checked to be refused: {schema, documents} for the Python validator.
json::array drawn_documents() {
  std::mt19937 rng(2026);
  json::array checks;
  for (const SchemaCase& c : kCases) {
    const auto g = grammar_of(c.schema);
    json::array documents;
    for (int i = 0; i < 25; ++i) {
      const std::string doc = draw(g, rng);
      INFO(c.schema << "\ndrew: " << doc);
      json::error_code ec;
      const json::value parsed = json::parse(doc, ec);
      REQUIRE(!ec);
      documents.push_back(json::string(doc));
    }
    for (const char* bad : c.invalid) {
      INFO(c.schema << "\nmust refuse: " << bad);
      CHECK_FALSE(accepts(g, bad));
    }
    checks.push_back(json::object{{"schema", json::parse(c.schema)}, {"documents", documents}});
  }
  return checks;
}

}  // namespace

TEST_CASE("documents drawn from a schema's grammar are JSON, and its invalid ones are refused",
          "[grammar][json]") {
  CHECK(drawn_documents().size() == std::size(kCases));
}

TEST_CASE("documents drawn from a schema's grammar are valid JSON of that schema",
          "[grammar][json]") {
  if (!have_jsonschema()) {
    troupe::test::skip_test(std::string(kPython) +
                            " with jsonschema (Debian's python3-jsonschema) is not here: the "
                            "drawn documents cannot be validated against their schemas");
  }
  const json::array checks = drawn_documents();
  const auto dir = std::filesystem::temp_directory_path() / "troupe-json-schema-test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "checks.json") << json::serialize(checks);
  std::ofstream(dir / "validate.py") << R"(import json, sys, jsonschema
failures = 0
for case in json.load(open(sys.argv[1])):
    for doc in case["documents"]:
        errors = list(jsonschema.Draft202012Validator(case["schema"],
                      format_checker=jsonschema.FormatChecker()).iter_errors(json.loads(doc)))
        if errors:
            failures += 1
            print("INVALID", json.dumps(case["schema"]), doc, errors[0].message)
print("failures", failures)
sys.exit(1 if failures else 0)
)";
  const std::string command = std::string(kPython) + " " + (dir / "validate.py").string() + " " +
                              (dir / "checks.json").string() + " > " + (dir / "out.txt").string() +
                              " 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(dir / "out.txt");
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(report);
  CHECK(status == 0);
  CHECK_THAT(report, Catch::Contains("failures 0"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a schema the grammar cannot honour is refused, naming the keyword and the place",
          "[grammar][json]") {
  auto error_of = [](const char* schema) {
    auto grammar = parse_json_schema(json::parse(schema));
    return grammar ? std::string() : grammar.error().message;
  };
  CHECK_THAT(error_of(R"({"type": "object", "properties": {"a": {"not": {"type": "null"}}}})"),
             Catch::Contains("'not'") && Catch::Contains("/properties/a"));
  CHECK_THAT(error_of(R"({"type": "array", "uniqueItems": true})"), Catch::Contains("uniqueItems"));
  CHECK_THAT(error_of(R"({"anyOf": [{"type": "integer"}], "not": {"const": 1}})"),
             Catch::Contains("'not'"));
  CHECK_THAT(error_of(R"({"enum": [1, 2], "if": {"const": 1}})"), Catch::Contains("'if'"));
  CHECK_THAT(error_of(R"({"type": "string", "const": 1})"), Catch::Contains("not of its type"));
  CHECK_THAT(error_of(R"({"type": "object", "required": ["x"], "additionalProperties": false})"),
             Catch::Contains("'x' is required"));
  CHECK_THAT(error_of(R"({"type": "string", "enum": [1, null]})"), Catch::Contains("enum"));
  CHECK_THAT(error_of(R"({"$ref": "https://example.com/s.json"})"), Catch::Contains("local"));
  CHECK_THAT(error_of(R"({"$ref": "#/$defs/missing"})"), Catch::Contains("not defined"));
  CHECK_THAT(error_of(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
             Catch::Contains("no integer"));
  CHECK_THAT(error_of(R"({"type": "number", "maximum": 4.5})"), Catch::Contains("not supported"));
  CHECK_THAT(error_of(R"({"type": "string", "pattern": "^a+$", "maxLength": 3})"),
             Catch::Contains("maxLength") && Catch::Contains("pattern"));
  CHECK_THAT(error_of(R"({"type": "string", "format": "email", "minLength": 3})"),
             Catch::Contains("minLength") && Catch::Contains("format"));
  CHECK_THAT(error_of(R"js({"type": "string", "pattern": "(?=a)"})js"),
             Catch::Contains("/pattern") && Catch::Contains("lookaround"));
  CHECK_THAT(error_of(R"({"type": "tuple"})"), Catch::Contains("unknown type"));
  CHECK_THAT(error_of(R"js({"type": "string", "pattern": "^say \"hi\"$"})js"),
             Catch::Contains("quote, a backslash"));
  CHECK_THAT(error_of(R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})"),
             Catch::Contains("allOf"));
  // What $ref, const, enum and the combinators would drop beside them is refused.
  CHECK_THAT(
      error_of(R"({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 2})"),
      Catch::Contains("'maxLength' beside '$ref'"));
  CHECK_THAT(error_of(R"({"anyOf": [{"type": "string"}], "minLength": 2})"),
             Catch::Contains("'minLength' beside 'anyOf'"));
  CHECK_THAT(error_of(R"({"enum": ["a", "b"], "maxLength": 1})"),
             Catch::Contains("'maxLength' beside 'enum'"));
  // Annotations beside them are fine (Pydantic writes a title and a default beside anyOf).
  CHECK(error_of(R"({"anyOf": [{"type": "string"}, {"type": "null"}], "default": null,
                     "title": "X"})")
            .empty());
  CHECK(error_of(R"({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s",
                     "description": "d"})")
            .empty());
  CHECK_THAT(error_of(R"(false)"), Catch::Contains("admits nothing"));
  CHECK_THAT(error_of(R"(3)"), Catch::Contains("object or a boolean"));
  CHECK_THAT(error_of(R"({"type": "array", "minItems": 5000})"), Catch::Contains("4096"));
}

TEST_CASE("integer bounds admit exactly the integers between them", "[grammar][json]") {
  // Bounds whose inner digits differ, both signs, zero and single digits; every integer
  // from -2100 to 2100 checked against each.
  const std::vector<std::pair<int, int>> bounds = {
      {101, 999}, {-1001, -101},  {5, 123}, {0, 0},  {-9, 9},     {-150, 1203},
      {19, 2001}, {-2000, -1999}, {7, 70},  {-1, 1}, {990, 1009}, {120, 129}};
  for (const auto& [lo, hi] : bounds) {
    const std::string schema = R"({"type": "integer", "minimum": )" + std::to_string(lo) +
                               R"(, "maximum": )" + std::to_string(hi) + "}";
    const auto g = grammar_of(schema.c_str());
    for (int x = -2100; x <= 2100; ++x) {
      INFO(schema << " with " << x);
      REQUIRE(accepts(g, std::to_string(x)) == (x >= lo && x <= hi));
    }
  }
  const auto open_above = grammar_of(R"({"type": "integer", "minimum": 150})");
  const auto open_below = grammar_of(R"({"type": "integer", "maximum": -37})");
  for (int x = -2100; x <= 2100; ++x) {
    INFO(x);
    REQUIRE(accepts(open_above, std::to_string(x)) == (x >= 150));
    REQUIRE(accepts(open_below, std::to_string(x)) == (x <= -37));
  }
}

TEST_CASE("the json_object grammar takes any object and nothing else", "[grammar][json]") {
  auto grammar = json_object_grammar();
  REQUIRE(grammar.has_value());
  auto compiled = compile(*grammar);
  REQUIRE(compiled.has_value());
  const auto g = std::make_shared<const CompiledGrammar>(std::move(*compiled));
  CHECK(accepts(g, R"({"a": [1, 2.5e3, {"b": null}], "c": "d\u00e9\n"})"));
  CHECK(accepts(g, "{}"));
  CHECK_FALSE(accepts(g, "[]"));
  CHECK_FALSE(accepts(g, R"({"a": 1,})"));
  CHECK_FALSE(accepts(g, R"({"a": 01})"));
}

namespace {

// A schema whose $defs are a flat chain of `hops` references, a0 -> a1 -> ... -> integer:
// shallow as JSON, deep as a conversion.
json::value ref_chain(int hops) {
  json::object defs;
  for (int i = 0; i < hops; ++i) {
    defs["a" + std::to_string(i)] = json::object{{"$ref", "#/$defs/a" + std::to_string(i + 1)}};
  }
  defs["a" + std::to_string(hops)] = json::object{{"type", "integer"}};
  return json::object{{"$defs", std::move(defs)}, {"$ref", "#/$defs/a0"}};
}

}  // namespace

TEST_CASE("a chain of $ref hops counts as nesting, refused past the depth, never a crash",
          "[grammar][json]") {
  for (const int hops : {10, 60}) {
    INFO(hops << " hops");
    const auto grammar = parse_json_schema(ref_chain(hops));
    REQUIRE(grammar.has_value());
  }
  // A flat chain of 10 000 hops used to overflow the converter's stack (SIGSEGV).
  for (const int hops : {65, 10'000, 100'000}) {
    INFO(hops << " hops");
    const auto grammar = parse_json_schema(ref_chain(hops));
    REQUIRE_FALSE(grammar.has_value());
    CHECK_THAT(grammar.error().message,
               Catch::Contains("nested too deep") && Catch::Contains("$ref hops"));
  }
  // Hops through nesting and references together count as one depth.
  json::object defs;
  for (int i = 0; i < 40; ++i) {
    defs["a" + std::to_string(i)] = json::object{
        {"type", "array"}, {"items", json::object{{"$ref", "#/$defs/a" + std::to_string(i + 1)}}}};
  }
  defs["a40"] = json::object{{"type", "integer"}};
  const auto mixed = parse_json_schema(json::object{{"$defs", defs}, {"$ref", "#/$defs/a0"}});
  REQUIRE_FALSE(mixed.has_value());
  CHECK_THAT(mixed.error().message, Catch::Contains("nested too deep"));
}

TEST_CASE("a schema with 10 000 properties converts in one pass, and is refused by its size",
          "[grammar][json]") {
  // Each optional property makes a "-rest" rule: their names used to be found by trying
  // every suffix from 2 again (5 * 10^7 tries, 12 s); now the conversion is linear, and
  // the grammar is refused for its rules, not held for seconds.
  json::object properties;
  for (int i = 0; i < 10'000; ++i)
    properties["p" + std::to_string(i)] = json::object{{"type", "string"}};
  const json::value schema = json::object{{"type", "object"}, {"properties", properties}};
  const auto gbnf = json_schema_to_gbnf(schema);
  REQUIRE(gbnf.has_value());
  CHECK_THAT(*gbnf, Catch::Contains("root-rest-9999 ::="));
  const auto parsed = parse_gbnf(*gbnf);
  REQUIRE(parsed.has_value());
  const auto compiled = compile(*parsed);
  REQUIRE_FALSE(compiled.has_value());
  CHECK_THAT(compiled.error().message, Catch::Contains("at most 20000"));
}
