// Tool calling's request side (tools, tool_choice, the grammar of a forced call) and its
// output side (each family's format read back as calls, whole and streamed).
#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include "grammar/gbnf.hpp"
#include "grammar/matcher.hpp"
#include "net/tool_calls.hpp"

using namespace troupe;
using namespace troupe::net;
namespace json = boost::json;

namespace {

const char* kTools = R"({"tools": [
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "add"}}]})";

json::object body_with(const std::string& extra) {
  json::object o = json::parse(kTools).as_object();
  if (!extra.empty()) {
    const json::value more = json::parse(extra);
    for (const auto& [k, v] : more.as_object()) o[k] = v;
  }
  return o;
}

ToolRequest request_of(const std::string& extra, std::string& grammar,
                       ToolCallFormat format = ToolCallFormat::hermes) {
  auto r = parse_tool_request(body_with(extra), format, grammar);
  REQUIRE(r.has_value());
  return *r;
}

// Whether `gbnf`'s grammar matches `text` whole.
bool matches(const std::string& gbnf, std::string_view text) {
  auto parsed = grammar::parse_gbnf(gbnf);
  REQUIRE(parsed.has_value());
  auto compiled = grammar::compile(*parsed);
  REQUIRE(compiled.has_value());
  grammar::Matcher m(std::make_shared<const grammar::CompiledGrammar>(std::move(*compiled)));
  return m.accept_bytes(text) && m.can_end();
}

ToolRequest automatic(ToolCallFormat format) {
  ToolRequest r;
  r.choice = ToolRequest::Choice::automatic;
  r.format = format;
  return r;
}

// What a stream of `pieces` sends as content, and what it reads at the end.
std::pair<std::string, ToolOutput> streamed(const ToolRequest& request,
                                            const std::vector<std::string>& pieces) {
  ToolCallStream stream(request);
  std::string sent;
  for (const auto& piece : pieces) sent += stream.take(piece, false).content;
  ToolOutput end = stream.take("", true);
  sent += end.content;
  return {sent, std::move(end)};
}

}  // namespace

TEST_CASE("tool_choice defaults to auto with tools and to none without", "[net]") {
  std::string grammar;
  CHECK(request_of("", grammar).choice == ToolRequest::Choice::automatic);
  CHECK(grammar.empty());
  auto none = parse_tool_request(json::object{}, ToolCallFormat::hermes, grammar);
  REQUIRE(none.has_value());
  CHECK_FALSE(none->reads_calls());
  CHECK(request_of(R"({"tool_choice": "none"})", grammar).choice == ToolRequest::Choice::none);
}

TEST_CASE("a forced call holds the output to a grammar", "[net]") {
  std::string named;
  const auto r = request_of(R"({"tool_choice": {"type": "function",
                                "function": {"name": "get_weather"}}})",
                            named);
  CHECK(r.choice == ToolRequest::Choice::named);
  CHECK(r.function == "get_weather");
  // The named function's arguments, and nothing else (no other keys: the parameters
  // declare properties and say nothing of others).
  CHECK(matches(named, R"({"city": "Oslo"})"));
  CHECK_FALSE(matches(named, R"({})"));
  CHECK_FALSE(matches(named, R"({"city": "Oslo", "x": 1})"));
  CHECK_FALSE(matches(named, R"([{"name": "get_weather", "parameters": {"city": "Oslo"}}])"));
  std::string required;
  CHECK(request_of(R"({"tool_choice": "required"})", required).choice ==
        ToolRequest::Choice::required);
  // One call or more, each of a tool by its name with that tool's parameters.
  CHECK(matches(required, R"([{"name": "get_weather", "parameters": {"city": "Oslo"}}])"));
  CHECK(matches(required, R"([{"name": "add", "parameters": {}}, )"
                          R"({"name": "get_weather", "parameters": {"city": "Rome"}}])"));
  CHECK_FALSE(matches(required, R"([])"));
  CHECK_FALSE(matches(required, R"([{"name": "nope", "parameters": {}}])"));
  CHECK_FALSE(matches(required, R"([{"name": "get_weather", "parameters": {}}])"));
  // parallel_tool_calls false: one call at most.
  std::string single;
  request_of(R"({"tool_choice": "required", "parallel_tool_calls": false})", single);
  CHECK(matches(single, R"([{"name": "add", "parameters": {}}])"));
  CHECK_FALSE(matches(single, R"([{"name": "add", "parameters": {}}, )"
                              R"({"name": "add", "parameters": {}}])"));
}

TEST_CASE("a required call keeps each function's own definitions and references", "[net]") {
  // Two functions with a definition of the same name (as pydantic writes them), one
  // recursive through "#": each must still mean its own.
  const char* tools = R"({"tools": [
    {"type": "function", "function": {"name": "move", "parameters": {
      "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}},
                          "required": ["x"], "additionalProperties": false}},
      "type": "object", "properties": {"to": {"$ref": "#/$defs/Point"}}, "required": ["to"],
      "additionalProperties": false}}},
    {"type": "function", "function": {"name": "tag", "parameters": {
      "definitions": {"Point": {"enum": ["a", "b"]}},
      "type": "object", "properties": {"p": {"$ref": "#/definitions/Point"},
                                       "next": {"$ref": "#"}},
      "required": ["p"], "additionalProperties": false}}}],
    "tool_choice": "required"})";
  std::string gbnf;
  auto r = parse_tool_request(json::parse(tools).as_object(), ToolCallFormat::hermes, gbnf);
  INFO((r ? gbnf : r.error().message));
  REQUIRE(r.has_value());
  CHECK(matches(gbnf, R"([{"name": "move", "parameters": {"to": {"x": 3}}}])"));
  CHECK(matches(gbnf, R"([{"name": "tag", "parameters": {"p": "a", "next": {"p": "b"}}}])"));
  CHECK_FALSE(matches(gbnf, R"([{"name": "move", "parameters": {"to": "a"}}])"));
  CHECK_FALSE(matches(gbnf, R"([{"name": "tag", "parameters": {"p": {"x": 3}}}])"));
  // The same schema alone (a named function) is read as it was.
  json::object defs;
  const json::value moved = hoist_definitions(
      json::parse(R"({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"type": "null"}},
                      "$ref": "#/$defs/A"})"),
      "f7-", defs);
  CHECK(json::serialize(moved) == R"({"$ref":"#/$defs/f7-A"})");
  CHECK(json::serialize(defs) == R"({"f7-A":{"$ref":"#/$defs/f7-B"},"f7-B":{"type":"null"}})");
}

TEST_CASE("tool requests that cannot be served are 400s naming the field", "[net]") {
  auto error_of = [](const json::object& body, std::string grammar = {}) {
    auto r = parse_tool_request(body, ToolCallFormat::hermes, grammar);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().status == 400);
    return r.error();
  };
  CHECK(error_of(body_with(R"({"tool_choice": {"type": "function", "function": {"name": "x"}}})"))
            .param == "tool_choice");
  CHECK(error_of(json::parse(R"({"tool_choice": "required"})").as_object()).param == "tool_choice");
  CHECK(error_of(body_with(R"({"tool_choice": "sometimes"})")).param == "tool_choice");
  CHECK(error_of(json::parse(R"({"tools": [{"type": "function"}]})").as_object()).param == "tools");
  CHECK(error_of(json::parse(R"({"tools": {}})").as_object()).param == "tools");
  // Another constraint beside a forced call.
  CHECK(error_of(body_with(R"({"tool_choice": "required"})"), "root ::= \"a\"").param ==
        "tool_choice");
  // Parameters the grammar cannot hold a forced call to.
  const auto unsupported = json::parse(R"({"tool_choice": "required", "tools": [{"type":
      "function", "function": {"name": "f", "parameters": {"not": {"type": "string"}}}}]})");
  CHECK(error_of(unsupported.as_object()).message.find("not") != std::string::npos);
}

TEST_CASE("forced calls are read back: a named function's arguments, required's array", "[net]") {
  std::string grammar;
  const auto named = request_of(
      R"({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}})", grammar);
  auto out = read_tool_calls(named, R"( {"city": "Oslo"} )");
  REQUIRE(out.calls.size() == 1);
  CHECK(out.calls[0].name == "get_weather");
  CHECK(json::parse(out.calls[0].arguments) == json::parse(R"({"city":"Oslo"})"));
  CHECK(out.calls[0].id.starts_with("call_"));
  CHECK(out.content.empty());
  // Cut short (max_tokens): no call, the text stays content.
  CHECK(read_tool_calls(named, R"({"city": "Os)").calls.empty());

  grammar.clear();
  const auto required = request_of(R"({"tool_choice": "required"})", grammar);
  out = read_tool_calls(required, R"([{"name": "add", "parameters": {"a": 1}},
                                      {"name": "get_weather", "parameters": {"city": "Rome"}}])");
  REQUIRE(out.calls.size() == 2);
  CHECK(out.calls[0].name == "add");
  CHECK(out.calls[1].arguments == R"({"city":"Rome"})");
  CHECK(out.calls[0].id != out.calls[1].id);
}

TEST_CASE("auto reads each family's own format", "[net]") {
  const auto hermes = read_tool_calls(
      automatic(ToolCallFormat::hermes),
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n"
      "</tool_call>");
  REQUIRE(hermes.calls.size() == 2);
  CHECK(hermes.content == "Let me look.");
  CHECK(hermes.calls[0].arguments == R"({"city":"Paris"})");
  CHECK(hermes.calls[1].name == "add");

  const auto llama = read_tool_calls(
      automatic(ToolCallFormat::llama3_json),
      R"({"name": "get_weather", "parameters": {"city": "Lima"}}; {"name": "add", "parameters": {}})");
  REQUIRE(llama.calls.size() == 2);
  CHECK(llama.calls[0].arguments == R"({"city":"Lima"})");
  CHECK(llama.content.empty());

  const auto mistral =
      read_tool_calls(automatic(ToolCallFormat::mistral),
                      R"([TOOL_CALLS][{"name": "add", "arguments": {"a": 2}, "id": "abc123XYZ"}])");
  REQUIRE(mistral.calls.size() == 1);
  CHECK(mistral.calls[0].id == "abc123XYZ");  // the model's own id is kept
  // Mistral's marker is a control token: without it the bare array is read too.
  CHECK(read_tool_calls(automatic(ToolCallFormat::mistral), R"( [{"name": "add"}])").calls.size() ==
        1);

  // Plain answers, and calls that do not parse, stay content.
  for (auto format :
       {ToolCallFormat::hermes, ToolCallFormat::llama3_json, ToolCallFormat::mistral}) {
    const auto plain = read_tool_calls(automatic(format), "It is sunny.");
    CHECK(plain.calls.empty());
    CHECK(plain.content == "It is sunny.");
  }
  const auto broken =
      read_tool_calls(automatic(ToolCallFormat::hermes), "<tool_call>\n{\"name\": \"add\", \"argu");
  CHECK(broken.calls.empty());
  CHECK(broken.content == "<tool_call>\n{\"name\": \"add\", \"argu");
}

TEST_CASE("a stream sends content until a call may begin, and reads the call at the end", "[net]") {
  // The marker split over pieces: nothing of it goes out as content.
  const auto [sent, end] = streamed(automatic(ToolCallFormat::hermes),
                                    {"Sure", ". <tool", "_call>\n{\"name\": \"add\", ",
                                     "\"arguments\": {\"a\": 1}}\n</tool_call>"});
  CHECK(sent == "Sure. ");
  REQUIRE(end.calls.size() == 1);
  CHECK(end.calls[0].arguments == R"({"a":1})");
  // A '<' that is not a call goes out once it is clear.
  const auto [plain, none] = streamed(automatic(ToolCallFormat::hermes), {"a <", "b> c"});
  CHECK(plain == "a <b> c");
  CHECK(none.calls.empty());
  // Llama 3.1 opens a call with the output itself.
  const auto [llama_sent, llama] = streamed(automatic(ToolCallFormat::llama3_json),
                                            {"  ", "{\"name\": \"add\"", ", \"parameters\": {}}"});
  CHECK(llama_sent.empty());
  CHECK(llama.calls.size() == 1);
  // A '<' that is not <|python_tag|> does not hold the stream back.
  const ToolRequest llama3 = automatic(ToolCallFormat::llama3_json);
  ToolCallStream think(llama3);
  CHECK(think.take("<", false).content.empty());
  CHECK(think.take("think> a", false).content == "<think> a");
  CHECK(think.take(" b", false).content == " b");
  const auto [text, no_call] = streamed(automatic(ToolCallFormat::llama3_json), {"Hi", " {x}"});
  CHECK(text == "Hi {x}");
  CHECK(no_call.calls.empty());
  // Without tools the text passes as it came.
  ToolRequest off;
  CHECK(streamed(off, {"<tool_call>", "x"}).first == "<tool_call>x");
}

TEST_CASE("the format comes from the chat template", "[net]") {
  CHECK(detect_tool_call_format("... <tool_call>\\n{...} ...") == ToolCallFormat::hermes);
  CHECK(detect_tool_call_format("{{ '[TOOL_CALLS][' }}") == ToolCallFormat::mistral);
  CHECK(detect_tool_call_format("<|start_header_id|>ipython") == ToolCallFormat::llama3_json);
  CHECK(detect_tool_call_format("") == ToolCallFormat::hermes);
  CHECK(tool_call_format_named("mistral") == ToolCallFormat::mistral);
  CHECK_FALSE(tool_call_format_named("xml").has_value());
}

TEST_CASE("tool calls are shaped as OpenAI sends them", "[net]") {
  const std::vector<ToolCall> calls{{"call_1", "add", R"({"a":1})"}};
  const auto whole = tool_calls_json(calls, false);
  CHECK(json::serialize(whole) ==
        R"([{"id":"call_1","type":"function","function":{"name":"add","arguments":"{\"a\":1}"}}])");
  CHECK(tool_calls_json(calls, true)[0].as_object().at("index") == 0);
}

namespace {

// A streamed call as a client puts it together from its deltas.
struct Assembled {
  std::string id;
  std::string name;
  std::string arguments;
  int num_argument_pieces = 0;
};

// Feeds `text` one byte at a time: the calls the deltas make, and what was read whole (its
// content: all the content the stream sent, each piece as it went).
std::pair<std::vector<Assembled>, ToolOutput> assembled(const ToolRequest& request,
                                                        const std::string& text) {
  ToolCallStream stream(request);
  std::vector<Assembled> calls;
  auto add = [&calls](const std::vector<ToolCallDelta>& deltas) {
    for (const auto& d : deltas) {
      if (d.index >= calls.size()) {
        REQUIRE(d.index == calls.size());  // a call opens with its id and name
        REQUIRE_FALSE(d.id.empty());
        calls.push_back({d.id, d.name, "", 0});
      } else {
        CHECK(d.id.empty());  // the header once
      }
      calls[d.index].arguments += d.arguments;
      if (!d.arguments.empty()) ++calls[d.index].num_argument_pieces;
    }
  };
  std::string content;
  for (const char c : text) {
    ToolOutput piece = stream.take(std::string(1, c), false);
    content += piece.content;
    add(piece.deltas);
  }
  ToolOutput end = stream.take("", true);
  add(end.deltas);
  end.content = content + end.content;
  return {calls, std::move(end)};
}

}  // namespace

TEST_CASE("a streamed call sends its name first, then its arguments as they are written", "[net]") {
  const auto [calls, end] = assembled(
      automatic(ToolCallFormat::hermes),
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo, \\\"N\\\"\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": [1, "
      "2]}}\n</tool_call>");
  REQUIRE(calls.size() == 2);
  REQUIRE(end.calls.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    // The deltas make the call read whole: its id, name and arguments, byte for byte.
    CHECK(calls[i].id == end.calls[i].id);
    CHECK(calls[i].name == end.calls[i].name);
    CHECK(calls[i].arguments == end.calls[i].arguments);
    CHECK(calls[i].num_argument_pieces > 3);  // as they came, not at the end
  }
  CHECK(end.calls[0].arguments == R"({"city":"Oslo, \"N\""})");
}

TEST_CASE("each family's calls stream as deltas", "[net]") {
  SECTION("Mistral's array") {
    const auto [calls, end] =
        assembled(automatic(ToolCallFormat::mistral),
                  R"([TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", )"
                  R"("arguments": {"city": "x"}}])");
    REQUIRE(calls.size() == 2);
    CHECK(calls[1].name == "get_weather");
    CHECK(calls[1].arguments == R"({"city":"x"})");
    CHECK(end.calls.size() == 2);
  }
  SECTION("Llama 3.1's bare object, with parameters") {
    const auto [calls, end] = assembled(automatic(ToolCallFormat::llama3_json),
                                        R"({"name": "add", "parameters": {"a": 1, "b": true}})");
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].arguments == R"({"a":1,"b":true})");
    CHECK(calls[0].arguments == end.calls.at(0).arguments);
  }
  SECTION("arguments written before the name wait for it") {
    const auto [calls, end] = assembled(automatic(ToolCallFormat::hermes),
                                        R"(<tool_call>{"arguments": {"a": 1}, "name": "add"})"
                                        "</tool_call>");
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].name == "add");
    CHECK(calls[0].arguments == R"({"a":1})");
  }
  SECTION("arguments given as a JSON string come whole at the end") {
    const auto [calls, end] = assembled(automatic(ToolCallFormat::hermes),
                                        R"(<tool_call>{"name": "add", "arguments": "{\"a\": 1}"})"
                                        "</tool_call>");
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].arguments == R"({"a": 1})");
    CHECK(calls[0].num_argument_pieces == 1);
  }
  SECTION("a named function's output is its arguments, its name known at once") {
    std::string grammar;
    const auto named = request_of(
        R"({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}})", grammar);
    ToolCallStream stream(named);
    const auto first = stream.take("{", false);
    REQUIRE(first.deltas.size() == 1);
    CHECK(first.deltas[0].name == "get_weather");
    CHECK(first.deltas[0].arguments == "{");
    const auto [calls, end] = assembled(named, R"({"city": "Oslo"})");
    REQUIRE(calls.size() == 1);
    CHECK(calls[0].arguments == R"({"city":"Oslo"})");
    CHECK(calls[0].arguments == end.calls.at(0).arguments);
  }
  SECTION("required's array, with parameters") {
    std::string grammar;
    const auto required = request_of(R"({"tool_choice": "required"})", grammar);
    const auto [calls, end] =
        assembled(required, R"([{"name": "add", "parameters": {}}, {"name": "add", "parameters": )"
                            R"({"b": null}}])");
    REQUIRE(calls.size() == 2);
    CHECK(calls[0].arguments == "{}");
    CHECK(calls[1].arguments == R"({"b":null})");
    CHECK(end.calls.size() == 2);
  }
  SECTION("text that was no call after all goes out as content, with no deltas") {
    const auto [calls, end] = assembled(automatic(ToolCallFormat::hermes), "a <tool_call> b");
    CHECK(calls.empty());
    CHECK(end.calls.empty());
    CHECK(end.content == "a <tool_call> b");
  }
}
