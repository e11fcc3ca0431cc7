// POST /v1/responses: a Responses body read as the chat request it asks for, its
// refusals (vLLM's 404 for a previous_response_id without a store), the response object
// with reasoning, message and function_call items, and its stream of typed events.
#include "net/responses_api.hpp"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "net_test_support.hpp"
#include "support/mini_json.hpp"
#include "support/raw_client.hpp"

using namespace troupe;

namespace {

const std::string kTemplate =
    "{%- for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}[call {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}]{% endfor %}{% endif %}</{{ m.role }}>{% endfor %}"
    "{%- if add_generation_prompt %}<assistant>{% endif %}";

struct Served : test::ServedEngine {
  explicit Served(std::string reasoning_parser = "")
      : ServedEngine("responses", config(std::move(reasoning_parser)), 256, 128) {}

  // HTTP/1.0: a stream's body is its events as written.
  std::pair<int, std::string> post(const std::string& body) {
    test::RawClient client(server->port());
    REQUIRE(client.connected());
    REQUIRE(
        client.send("POST /v1/responses HTTP/1.0\r\nHost: test\r\n"
                    "Content-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body));
    const std::string reply = client.read_all(std::chrono::seconds(30));
    const auto head_end = reply.find("\r\n\r\n");
    REQUIRE(head_end != std::string::npos);
    return {test::http_status(reply), reply.substr(head_end + 4)};
  }

  static net::ServerConfig config(std::string reasoning_parser) {
    net::ServerConfig c;
    c.chat_template = kTemplate;
    c.chat_template_origin = "the test's template";
    c.reasoning_parser = std::move(reasoning_parser);
    return c;
  }
};

net::ApiError refusal(const tl::expected<net::CompletionRequest, net::ApiError>& parsed) {
  REQUIRE_FALSE(parsed.has_value());
  return parsed.error();
}

struct Event {
  std::string type;
  test::Json data;
};

// A stream's events, in order; each event line names the type its data carries.
std::vector<Event> events_of(const std::string& body) {
  std::vector<Event> events;
  std::size_t at = 0;
  while ((at = body.find("event: ", at)) != std::string::npos) {
    const auto line_end = body.find('\n', at);
    const auto data_end = body.find("\n\n", line_end);
    REQUIRE(body.compare(line_end + 1, 6, "data: ") == 0);
    Event e{body.substr(at + 7, line_end - at - 7),
            test::JsonParser(body.substr(line_end + 7, data_end - line_end - 7)).parse()};
    CHECK(e.data["type"].string == e.type);
    events.push_back(std::move(e));
    at = data_end;
  }
  return events;
}

}  // namespace

TEST_CASE("a Responses body is the chat request it stands for", "[net][responses]") {
  Served s;
  const auto& tokenizer = s.engine->tokenizer();
  const auto context = net::make_api_context(tokenizer, 256, "troupe", kTemplate);
  const auto request = net::parse_responses_request(
      R"({"instructions":"Be brief","input":[)"
      R"({"role":"user","content":[{"type":"input_text","text":"Weather?"}]},)"
      R"({"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Oslo\"}"},)"
      R"({"type":"function_call_output","call_id":"call_1","output":"cold"},)"
      R"({"type":"message","role":"assistant","content":[{"type":"output_text","text":"It is cold."}]}],)"
      R"("max_output_tokens":5,"store":false,"metadata":{"k":"v"}})",
      context);
  INFO((request ? std::string() : request.error().message));
  REQUIRE(request.has_value());
  CHECK(request->responses());
  CHECK(request->chat);
  CHECK(request->generate.params.max_tokens == 5);
  CHECK(tokenizer.decode(request->generate.prompt) ==
        tokenizer.decode(
            tokenizer.encode("<system>Be brief</system><user>Weather?</user>"
                             "<assistant>None[call get_weather {\"city\": \"Oslo\"}]</assistant>"
                             "<tool>cold</tool><assistant>It is cold.</assistant><assistant>",
                             true, true)));
  // (A call turn has no content: None, as jinja2 prints it.) A plain text input is the user's
  // message.
  const auto text = net::parse_responses_request(R"({"input":"Hi"})", context);
  REQUIRE(text.has_value());
  CHECK(text->generate.prompt == tokenizer.encode("<user>Hi</user><assistant>", true, true));
}

TEST_CASE("what a stateless server cannot honour is refused naming the field", "[net][responses]") {
  Served s;
  const auto context = net::make_api_context(s.engine->tokenizer(), 256, "troupe", kTemplate);
  auto parse = [&context](const std::string& body) {
    return net::parse_responses_request(body, context);
  };
  const auto previous = refusal(parse(R"({"input":"Hi","previous_response_id":"resp_9"})"));
  CHECK(previous.status == 404);
  CHECK(previous.param == "previous_response_id");
  CHECK_THAT(previous.message, Catch::Contains("resp_9") && Catch::Contains("not found"));
  CHECK(refusal(parse(R"({"input":"Hi","background":true})")).param == "background");
  CHECK(refusal(parse(R"({"input":"Hi","include":["reasoning.encrypted_content"]})")).param ==
        "include");
  CHECK(refusal(parse(R"({"input":"Hi","frobnicate":1})")).param == "frobnicate");
  CHECK(refusal(parse(R"({"input":"Hi","tools":[{"type":"web_search"}]})")).param == "tools");
  CHECK(refusal(parse(R"({"input":"Hi","text":{"format":{"type":"yaml"}}})")).param == "text");
  CHECK(refusal(parse(R"({})")).param == "input");
  CHECK(refusal(parse(R"({"input":[{"type":"item_reference","id":"x"}]})")).param == "input");
  CHECK(refusal(parse(R"({"input":[{"role":"user","content":[{"type":"input_image"}]}]})")).param ==
        "input");
  // A chat field's refusal names the Responses field it came from.
  const auto zero = refusal(parse(R"({"input":"Hi","max_output_tokens":0})"));
  CHECK(zero.param == "max_output_tokens");
  CHECK_THAT(zero.message, Catch::Contains("'max_output_tokens'"));
  // A schema for the output is text.format's.
  const auto schema = parse(
      R"({"input":"Hi","text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}}})");
  INFO((schema ? std::string() : schema.error().message));
  REQUIRE(schema.has_value());
  CHECK_FALSE(schema->generate.params.grammar.empty());
}

TEST_CASE("the response object holds reasoning, message and function_call items",
          "[net][responses]") {
  Served s;
  auto context = net::make_api_context(s.engine->tokenizer(), 256, "troupe", kTemplate);
  context.reasoning_format = text::ReasoningFormat::deepseek_r1;
  const auto request = net::parse_responses_request(
      R"({"input":"Weather?","tools":[{"type":"function","name":"get_weather","parameters":{}}]})",
      context);
  INFO((request ? std::string() : request.error().message));
  REQUIRE(request.has_value());
  net::CompletionOutput output;
  output.text =
      "I should look.</think>Let me check.<tool_call>{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Oslo\"}}</tool_call>";
  output.end.finished = true;
  output.end.finish_reason = FinishReason::stop;
  output.end.num_prompt_tokens = 7;
  output.end.num_generated_tokens = 20;
  const auto response =
      test::JsonParser(net::responses_response(context, "resp_3", 100, *request, output)).parse();
  CHECK(response["object"].string == "response");
  CHECK(response["status"].string == "completed");
  CHECK(response["store"].boolean == false);
  CHECK(response["usage"]["input_tokens"].number == 7);
  CHECK(response["usage"]["output_tokens"].number == 20);
  const auto& items = response["output"].array;
  REQUIRE(items.size() == 3);
  CHECK(items[0]["type"].string == "reasoning");
  CHECK(items[0]["content"].array.at(0)["text"].string == "I should look.");
  CHECK(items[1]["type"].string == "message");
  CHECK(items[1]["content"].array.at(0)["text"].string == "Let me check.");
  CHECK(items[2]["type"].string == "function_call");
  CHECK(items[2]["name"].string == "get_weather");
  CHECK(items[2]["arguments"].string == R"({"city":"Oslo"})");
  CHECK_THAT(items[2]["call_id"].string, Catch::StartsWith("call_"));
}

TEST_CASE("a streamed response sends its typed events in order", "[net][responses][integration]") {
  Served s;
  const std::string body =
      R"({"input":"Hi","max_output_tokens":8,"temperature":0.7,"seed":5,"ignore_eos":true)";
  const auto [status, whole] = s.post(body + "}");
  INFO(whole);
  REQUIRE(status == 200);
  const auto response = test::JsonParser(whole).parse();
  CHECK(response["status"].string == "incomplete");
  CHECK(response["incomplete_details"]["reason"].string == "max_output_tokens");
  const std::string text = response["output"].array.at(0)["content"].array.at(0)["text"].string;

  const auto [stream_status, streamed] = s.post(body + R"(,"stream":true})");
  INFO(streamed);
  REQUIRE(stream_status == 200);
  const auto events = events_of(streamed);
  REQUIRE(events.size() >= 8);
  std::vector<std::string> types;
  std::string deltas;
  for (std::size_t i = 0; i < events.size(); ++i) {
    CHECK(events[i].data["sequence_number"].number == static_cast<double>(i));
    if (types.empty() || types.back() != events[i].type) types.push_back(events[i].type);
    if (events[i].type == "response.output_text.delta") deltas += events[i].data["delta"].string;
  }
  const std::vector<std::string> expected{
      "response.created",           "response.in_progress",
      "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.done",
      "response.content_part.done", "response.output_item.done",
      "response.incomplete"};
  CHECK(types == expected);
  CHECK(deltas == text);
  const auto& last = events.back().data["response"];
  CHECK(last["output"].array.at(0)["content"].array.at(0)["text"].string == text);
  CHECK(last["usage"]["output_tokens"].number == 8);
  CHECK(streamed.find("[DONE]") == std::string::npos);  // the Responses stream has none
  // Refusals come as OpenAI error objects with their status.
  CHECK(s.post(R"({"input":"Hi","previous_response_id":"resp_1"})").first == 404);
  CHECK(s.post(R"({"input":"Hi","top_logprobs":2})").first == 400);
}

TEST_CASE("a reasoning model's response streams its thinking as reasoning_text events",
          "[net][responses][reasoning][integration]") {
  Served s("deepseek_r1");
  const std::string body =
      R"({"input":"Hi","max_output_tokens":8,"temperature":0.7,"seed":5,"ignore_eos":true)";
  const auto [status, whole] = s.post(body + "}");
  REQUIRE(status == 200);
  const auto response = test::JsonParser(whole).parse();
  const auto& items = response["output"].array;
  REQUIRE(items.size() == 1);  // no </think>: all thinking, no answer yet
  REQUIRE(items[0]["type"].string == "reasoning");
  const std::string thought = items[0]["content"].array.at(0)["text"].string;
  CHECK_FALSE(thought.empty());
  const auto [stream_status, streamed] = s.post(body + R"(,"stream":true})");
  REQUIRE(stream_status == 200);
  std::string deltas;
  for (const auto& e : events_of(streamed)) {
    if (e.type == "response.reasoning_text.delta") deltas += e.data["delta"].string;
    CHECK(e.type != "response.output_text.delta");
  }
  CHECK(deltas == thought);
}
