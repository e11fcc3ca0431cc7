// --reasoning-parser: a chat's thinking given apart as reasoning_content, in the answer,
// as delta.reasoning_content chunks over SSE and on the socket's frames; the template's
// enable_thinking honoured through the prompt it renders; tool calls read from the answer.
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "net/choice_text.hpp"
#include "net/openai_api.hpp"
#include "net_test_support.hpp"
#include "support/mini_json.hpp"
#include "support/raw_client.hpp"
#include "support/test_support.hpp"

using namespace troupe;
namespace asio = boost::asio;
namespace websocket = boost::beast::websocket;
using tcp = asio::ip::tcp;

namespace {

// As Qwen3's and DeepSeek-R1's: the assistant's turn opens the thinking, or closes it at
// once when enable_thinking is false.
const std::string kTemplate =
    "{%- for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{%- if add_generation_prompt %}<assistant>"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think></think>"
    "{%- else %}<think>\n{% endif %}{% endif %}";

struct Served : test::ServedEngine {
  explicit Served(std::string parser)
      : ServedEngine("reasoning", config(std::move(parser)), 256, 128) {}

  // HTTP/1.0: a stream's body is its events as written (no chunked encoding).
  std::pair<int, std::string> post(const std::string& path, const std::string& body) {
    test::RawClient client(server->port());
    REQUIRE(client.connected());
    REQUIRE(client.send("POST " + path +
                        " HTTP/1.0\r\nHost: test\r\nContent-Type: application/json\r\n"
                        "Content-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body));
    const std::string reply = client.read_all(std::chrono::seconds(30));
    const auto head_end = reply.find("\r\n\r\n");
    REQUIRE(head_end != std::string::npos);
    return {test::http_status(reply), reply.substr(head_end + 4)};
  }

  static net::ServerConfig config(std::string parser) {
    net::ServerConfig c;
    c.chat_template = kTemplate;
    c.chat_template_origin = "the test's template";
    c.reasoning_parser = std::move(parser);
    return c;
  }
};

// A chat body: the same output every time (temperature 0, no early end).
std::string chat_body(const std::string& extra) {
  return R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":16,"temperature":0,)"
         R"("ignore_eos":true)" +
         extra + "}";
}

// The message of a non-streamed chat answer's first choice.
test::Json message_of(const std::string& body) {
  return test::JsonParser(body).parse()["choices"].array.at(0)["message"];
}

struct Streamed {
  std::string reasoning;
  std::string content;
  int num_reasoning_chunks = 0;
};

// A streamed chat's deltas, joined.
Streamed join_stream(const std::string& body) {
  Streamed s;
  std::size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const auto end = body.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    const std::string payload = body.substr(at + 6, end - at - 6);
    at = end;
    if (payload == "[DONE]") break;
    const auto chunk = test::JsonParser(payload).parse();
    if (chunk["choices"].array.empty()) continue;
    const auto& delta = chunk["choices"].array.at(0)["delta"];
    if (delta.object.contains("reasoning_content")) {
      s.reasoning += delta["reasoning_content"].string;
      ++s.num_reasoning_chunks;
    }
    if (delta.object.contains("content")) s.content += delta["content"].string;
  }
  return s;
}

net::CompletionOutput output_of(std::string text) {
  net::CompletionOutput output;
  output.text = std::move(text);
  output.end.finished = true;
  output.end.finish_reason = FinishReason::stop;
  return output;
}

}  // namespace

TEST_CASE("the answer gives the thinking apart as reasoning_content", "[net][reasoning]") {
  Served s("");
  auto context = net::make_api_context(s.engine->tokenizer(), 256, "troupe", kTemplate);
  context.reasoning_format = text::ReasoningFormat::qwen3;
  auto answer = [&context](const std::string& body, const std::string& output) {
    const auto request = net::parse_chat_request(body, context);
    INFO((request ? std::string() : request.error().message));
    REQUIRE(request.has_value());
    return message_of(
        net::completion_response(context, "chatcmpl-1", 0, *request, {output_of(output)}));
  };
  const std::string hi = R"({"messages":[{"role":"user","content":"Hi"}])";
  const auto thought = answer(hi + "}", "Let me see.\n</think>\n\nHello!");
  CHECK(thought["reasoning_content"].string == "Let me see.");
  CHECK(thought["content"].string == "Hello!");
  // Thinking turned off in the template: what comes is the answer.
  const auto off = answer(hi + R"(,"chat_template_kwargs":{"enable_thinking":false}})", "Hello!");
  CHECK(off["reasoning_content"].kind == test::Json::Kind::null);
  CHECK(off["content"].string == "Hello!");
  // Thinking cut off by max_tokens: no answer yet.
  const auto cut = answer(hi + "}", "Still thinking");
  CHECK(cut["reasoning_content"].string == "Still thinking");
  CHECK(cut["content"].kind == test::Json::Kind::null);
  // include_reasoning false (vLLM's) drops the thinking.
  const auto dropped = answer(hi + R"(,"include_reasoning":false})", "Hmm</think>Hello!");
  CHECK(dropped["reasoning_content"].kind == test::Json::Kind::null);
  CHECK(dropped["content"].string == "Hello!");
  // A call is read from the answer, after the thinking.
  const auto called = answer(
      hi + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]})",
      "I should call f.</think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  CHECK(called["reasoning_content"].string == "I should call f.");
  REQUIRE(called["tool_calls"].array.size() == 1);
  CHECK(called["tool_calls"].array.at(0)["function"]["name"].string == "f");
  CHECK(called["content"].kind == test::Json::Kind::null);
  // An output constraint holds for the answer: from the thinking's end marker on.
  const auto constrained =
      net::parse_chat_request(hi + R"(,"response_format":{"type":"json_object"}})", context);
  REQUIRE(constrained.has_value());
  CHECK(constrained->reasoning.has_value());
  CHECK_FALSE(constrained->generate.params.grammar.empty());
  CHECK(constrained->generate.params.grammar_after ==
        s.engine->tokenizer().encode("</think>", false, true));
  const auto json_thought = answer(hi + R"(,"response_format":{"type":"json_object"}})",
                                   "Braces then.</think>{\"a\": 1}");
  CHECK(json_thought["reasoning_content"].string == "Braces then.");
  CHECK(json_thought["content"].string == R"({"a": 1})");
  // Thinking turned off in the prompt: the grammar holds from the first token.
  const auto closed =
      net::parse_chat_request(hi + R"(,"response_format":{"type":"json_object"},)" +
                                  R"("chat_template_kwargs":{"enable_thinking":false}})",
                              context);
  REQUIRE(closed.has_value());
  CHECK(closed->generate.params.grammar_after.empty());
  // Without a parser the message is as before: no reasoning_content, the text whole.
  context.reasoning_format.reset();
  const auto plain = answer(hi + "}", "Hmm</think>Hello!");
  CHECK_FALSE(plain.object.contains("reasoning_content"));
  CHECK(plain["content"].string == "Hmm</think>Hello!");
}

TEST_CASE("gpt_oss reads the harmony markers, which the output shows for it", "[net][reasoning]") {
  Served s("");
  auto context = net::make_api_context(s.engine->tokenizer(), 256, "troupe",
                                       "{% for m in messages %}{{ m.content }}{% endfor %}"
                                       "<|start|>assistant");
  context.reasoning_format = text::ReasoningFormat::gpt_oss;
  const auto request =
      net::parse_chat_request(R"({"messages":[{"role":"user","content":"Hi"}]})", context);
  REQUIRE(request.has_value());
  // Harmony's markers are control tokens: the output must show them for the parser.
  CHECK_FALSE(request->generate.skip_special_tokens);
  const auto message = message_of(net::completion_response(
      context, "chatcmpl-1", 0, *request,
      {output_of("<|channel|>analysis<|message|>Greeting.<|end|><|start|>assistant"
                 "<|channel|>final<|message|>Hello!")}));
  CHECK(message["reasoning_content"].string == "Greeting.");
  CHECK(message["content"].string == "Hello!");
}

TEST_CASE("a streamed chat sends its thinking as delta.reasoning_content chunks",
          "[net][reasoning][integration]") {
  // The random model writes no </think>: under deepseek_r1, after a prompt that opened the
  // thinking, all of its output is thinking; after one that closed it, all is the answer.
  Served s("deepseek_r1");
  const auto [status, body] = s.post("/v1/chat/completions", chat_body(""));
  INFO(body);
  REQUIRE(status == 200);
  const auto whole = message_of(body);
  REQUIRE(whole["reasoning_content"].kind == test::Json::Kind::string);
  CHECK_FALSE(whole["reasoning_content"].string.empty());
  CHECK(whole["content"].kind == test::Json::Kind::null);

  const auto [stream_status, stream_body] =
      s.post("/v1/chat/completions", chat_body(R"(,"stream":true)"));
  INFO(stream_body);
  REQUIRE(stream_status == 200);
  const Streamed streamed = join_stream(stream_body);
  CHECK(streamed.num_reasoning_chunks > 1);  // as it comes, not at the end
  CHECK(streamed.reasoning == whole["reasoning_content"].string);
  CHECK(streamed.content.empty());

  // enable_thinking false: the same tokens are the answer.
  const std::string off = R"(,"chat_template_kwargs":{"enable_thinking":false})";
  const auto [off_status, off_body] = s.post("/v1/chat/completions", chat_body(off));
  REQUIRE(off_status == 200);
  const auto answer = message_of(off_body);
  CHECK(answer["reasoning_content"].kind == test::Json::Kind::null);
  CHECK_FALSE(answer["content"].string.empty());
  const auto [off_stream_status, off_stream_body] =
      s.post("/v1/chat/completions", chat_body(off + R"(,"stream":true)"));
  REQUIRE(off_stream_status == 200);
  const Streamed answered = join_stream(off_stream_body);
  CHECK(answered.num_reasoning_chunks == 0);
  CHECK(answered.content == answer["content"].string);
}

TEST_CASE("the socket's frames carry the thinking as reasoning_content",
          "[net][reasoning][websocket][integration]") {
  Served s("deepseek_r1");
  const auto [status, body] = s.post("/v1/chat/completions", chat_body(""));
  REQUIRE(status == 200);
  const std::string expected = message_of(body)["reasoning_content"].string;
  REQUIRE_FALSE(expected.empty());  // else the socket's empty thinking would match

  asio::io_context io;
  websocket::stream<tcp::socket> ws(io);
  tcp::resolver resolver(io);
  asio::connect(ws.next_layer(), resolver.resolve("127.0.0.1", std::to_string(s.server->port())));
  ws.handshake("127.0.0.1", "/v1/ws");
  const std::string generate = R"({"type":"generate","id":"r",)" + chat_body("").substr(1);
  ws.write(asio::buffer(generate));
  std::string reasoning, text;
  test::Json frame;
  do {
    boost::beast::flat_buffer buffer;
    ws.read(buffer);
    frame = test::JsonParser(boost::beast::buffers_to_string(buffer.data())).parse();
    INFO(boost::beast::buffers_to_string(buffer.data()));
    REQUIRE(frame["type"].string != "error");
    if (frame.object.contains("reasoning_content")) reasoning += frame["reasoning_content"].string;
    text += frame["text"].string;
  } while (frame["type"].string == "token");
  CHECK(frame["type"].string == "done");
  CHECK(reasoning == expected);
  CHECK(text.empty());
  ws.close(websocket::close_code::normal);
}

TEST_CASE("the output starts where Qwen3's real template leaves it", "[net][reasoning][shared]") {
  Served s("");
  const std::string source =
      test::read_text(test::shared_file("chat-templates/Qwen-Qwen3-0.6B.jinja"));
  auto context = net::make_api_context(s.engine->tokenizer(), 256, "troupe", source);
  context.reasoning_format = text::ReasoningFormat::qwen3;
  for (const bool thinking : {true, false}) {
    INFO("enable_thinking " << thinking);
    const auto request = net::parse_chat_request(
        std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") +
            R"("chat_template_kwargs":{"enable_thinking":)" + (thinking ? "true" : "false") + "}}",
        context);
    INFO((request ? std::string() : request.error().message));
    REQUIRE(request.has_value());
    // Thinking on, the model opens <think> itself; off, the template closed it already and
    // a "<think>" the model writes anyway is the answer's text.
    const auto message = message_of(net::completion_response(
        context, "chatcmpl-1", 0, *request, {output_of("<think>\nHm.\n</think>\n\nHello!")}));
    if (thinking) {
      CHECK(message["reasoning_content"].string == "Hm.");
      CHECK(message["content"].string == "Hello!");
    } else {
      CHECK(message["reasoning_content"].kind == test::Json::Kind::null);
      CHECK(message["content"].string == "<think>\nHm.\n</think>\n\nHello!");
    }
  }
}
