// Chat requests render through the served model's Jinja template: the messages as sent
// (tool calls, tool results and keys such as reasoning_content too), the request's tools and its
// chat_template_kwargs reach the template, and a template's raise_exception is the client's 400.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "net/openai_api.hpp"
#include "net_test_support.hpp"
#include "support/mini_json.hpp"
#include "support/raw_client.hpp"

namespace {

using namespace troupe;

// Every variable a chat template is given shows in its output.
const std::string kTemplate =
    "{%- for m in messages %}<{{ m.role }}>{{ m.content if m.content is string }}"
    "{% for c in m.tool_calls or [] %}call {{ c.function.name }} {{ c.function.arguments | tojson "
    "}}"
    "{% endfor %}{% if m.tool_call_id %} for {{ m.tool_call_id }}{% endif %}"
    "{% if m.reasoning_content %} (thought: {{ m.reasoning_content }}){% endif %}</{{ m.role }}>"
    "{% endfor %}\n"
    "{%- if tools %}tools: {{ tools | map(attribute='function.name') | join(', ') }}{% endif %}\n"
    "{%- if greeting is defined %} greeting: {{ greeting }}{% endif %}\n"
    "{%- if messages[0].role == 'system' %}{{ raise_exception('no system messages here') }}"
    "{% endif %}\n"
    "{%- if add_generation_prompt %}<assistant>{% endif %}";

const std::string kToolConversation =
    R"({"messages":[{"role":"user","content":"Weather?"},)"
    R"({"role":"assistant","content":null,"reasoning_content":"ask the tool","tool_calls":[{"id":"c1","type":"function",)"
    R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},)"
    R"({"role":"tool","tool_call_id":"c1","content":"sunny"}],)"
    R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}],)"
    R"("chat_template_kwargs":{"greeting":"hi"},"max_tokens":2,"temperature":0})";

const std::string kToolConversationText =
    "<user>Weather?</user><assistant>call get_weather {\"city\": \"Paris\"} (thought: ask the "
    "tool)</assistant>"
    "<tool>sunny for c1</tool>tools: get_weather greeting: hi<assistant>";

class TemplatedServer : public test::ServedEngine {
 public:
  explicit TemplatedServer(const std::string& chat_template)
      : ServedEngine("chat-template-model", config(chat_template), 256, 128) {}

  // POSTs a chat request; the status and the body.
  std::pair<int, std::string> chat(const std::string& body) {
    test::RawClient client(server->port());
    REQUIRE(client.connected());
    REQUIRE(
        client.send("POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
                    "Content-Type: application/json\r\nConnection: close\r\n"
                    "Content-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body));
    const std::string reply = client.read_all(std::chrono::seconds(30));
    const auto head_end = reply.find("\r\n\r\n");
    REQUIRE(head_end != std::string::npos);
    return {test::http_status(reply), reply.substr(head_end + 4)};
  }

 private:
  static net::ServerConfig config(const std::string& chat_template) {
    net::ServerConfig c;
    c.chat_template = chat_template;
    c.chat_template_origin = "the test's template";
    return c;
  }
};

}  // namespace

TEST_CASE("a chat request's messages, tools and chat_template_kwargs reach the Jinja template",
          "[net][chat]") {
  TemplatedServer s(kTemplate);
  CHECK(s.server->chat_template().is_jinja());
  CHECK(s.server->chat_template().description() ==
        "the test's template (Jinja, " + std::to_string(kTemplate.size()) + " B)");
  const auto& tokenizer = s.engine->tokenizer();
  const auto context = net::make_api_context(tokenizer, 256, "troupe", kTemplate);
  const auto request = net::parse_chat_request(kToolConversation, context);
  INFO((request ? std::string() : request.error().message));
  REQUIRE(request.has_value());
  CHECK(request->generate.prompt == tokenizer.encode(kToolConversationText, true, true));

  // The same over HTTP, through the server's --chat-template override.
  const auto [status, body] = s.chat(kToolConversation);
  INFO(body);
  REQUIRE(status == 200);
  const auto reply = test::JsonParser(body).parse();
  CHECK(reply["usage"]["prompt_tokens"].number ==
        static_cast<double>(tokenizer.encode(kToolConversationText, true, true).size()));
}

TEST_CASE("a template's raise_exception answers 400 with the template's message", "[net][chat]") {
  TemplatedServer s(kTemplate);
  const auto [status, body] = s.chat(
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]})");
  CHECK(status == 400);
  const auto reply = test::JsonParser(body).parse();
  CHECK(reply["error"]["message"].string == "no system messages here");
  CHECK(reply["error"]["type"].string == "invalid_request_error");

  const auto [bad_status, bad_body] =
      s.chat(R"({"messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":[1]})");
  CHECK(bad_status == 400);
  CHECK(test::JsonParser(bad_body).parse()["error"]["message"].string ==
        "'chat_template_kwargs' must be an object");
}

TEST_CASE("a template that prints BOS does not give the prompt a second one", "[net][chat]") {
  TemplatedServer s("{{ bos_token }}{{ messages[0].content }}");
  const auto& tokenizer = s.engine->tokenizer();
  REQUIRE(tokenizer.vocabulary().add_bos);  // the tokenizer adds BOS itself
  const auto context =
      net::make_api_context(tokenizer, 256, "troupe", "{{ bos_token }}{{ messages[0].content }}");
  const auto request =
      net::parse_chat_request(R"({"messages":[{"role":"user","content":"Hello world"}]})", context);
  REQUIRE(request.has_value());
  const auto expected = tokenizer.encode("Hello world", true, true);
  REQUIRE(expected.front() == tokenizer.vocabulary().bos);
  CHECK(request->generate.prompt == expected);
}

TEST_CASE("a template that does not parse falls back to the family renderer, saying why",
          "[net][chat]") {
  TemplatedServer s("<|im_start|>{% if %}");
  CHECK_FALSE(s.server->chat_template().is_jinja());
  CHECK(s.server->chat_template().description() == "built-in chatml fallback");
  CHECK(s.server->chat_template().warning() ==
        "the test's template does not parse (chat template syntax error at line 1, column 19: "
        "unexpected '%}')");
  const auto [status, body] = s.chat(R"({"messages":[{"role":"user","content":"Hi"}]})");
  CHECK(status == 200);
}
