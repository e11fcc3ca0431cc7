// What a request may ask is checked where it is parsed, with a 400 that names the field:
// logprobs and their alternatives, the stop strings and ids matched at every token, and a
// socket id echoed in every frame. As OpenAI and vLLM answer, not silently something else.
#include <catch2/catch.hpp>
#include <string>

#include "model/loaded_model.hpp"
#include "net/openai_api.hpp"
#include "support/small_model.hpp"

using namespace troupe;

namespace {

struct Parser {
  Parser() {
    auto opened = model::LoadedModel::open(test::write_small_model("limits"));
    REQUIRE(opened.has_value());
    model = std::make_unique<model::LoadedModel>(std::move(*opened));
    context = net::make_api_context(*model->tokenizer, 512, "troupe", "");
  }
  tl::expected<net::CompletionRequest, net::ApiError> chat(const std::string& fields) {
    return net::parse_chat_request(R"({"messages":[{"role":"user","content":"Hi"}])" + fields + "}",
                                   context);
  }
  tl::expected<net::CompletionRequest, net::ApiError> completion(const std::string& fields) {
    return net::parse_completion_request(R"({"prompt":"Hi")" + fields + "}", context);
  }
  std::unique_ptr<model::LoadedModel> model;
  net::ApiContext context;
};

// The 400 a parse gave, or a failed check when it gave none.
template <class Parsed>
net::ApiError refusal(const Parsed& parsed) {
  REQUIRE_FALSE(parsed.has_value());
  CHECK(parsed.error().status == 400);
  return parsed.error();
}

std::string repeated(const std::string& item, int n, const std::string& separator = ",") {
  std::string out;
  for (int i = 0; i < n; ++i) out += (i == 0 ? "" : separator) + item;
  return out;
}

}  // namespace

TEST_CASE("chat top_logprobs needs logprobs true and lies in [0, 20]", "[net][limits]") {
  Parser p;
  SECTION("without logprobs, or with logprobs false, alternatives are refused") {
    for (const std::string fields :
         {R"(,"top_logprobs":5)", R"(,"logprobs":false,"top_logprobs":5)",
          R"(,"logprobs":null,"top_logprobs":1)"}) {
      INFO(fields);
      const auto error = refusal(p.chat(fields));
      CHECK(error.param == "top_logprobs");
      CHECK(error.message == "'top_logprobs' needs 'logprobs': true");
    }
  }
  SECTION("past 20 the range is named, with top_logprobs as the param") {
    for (const std::string fields :
         {R"(,"logprobs":true,"top_logprobs":21)", R"(,"logprobs":true,"top_logprobs":-1)",
          R"(,"logprobs":true,"top_logprobs":4294967296)", R"(,"top_logprobs":21)"}) {
      INFO(fields);
      const auto error = refusal(p.chat(fields));
      CHECK(error.param == "top_logprobs");
      CHECK(error.message.find("'top_logprobs' must be in [0, 20]") == 0);
    }
  }
  SECTION("what is allowed") {
    const auto twenty = p.chat(R"(,"logprobs":true,"top_logprobs":20)");
    REQUIRE(twenty.has_value());
    CHECK(twenty->want_logprobs);
    CHECK(twenty->generate.params.logprobs == 20);
    const auto alone = p.chat(R"(,"logprobs":true)");
    REQUIRE(alone.has_value());
    CHECK(alone->generate.params.logprobs == 0);
    // No alternatives asked for: nothing to refuse (vLLM's rule).
    const auto zero = p.chat(R"(,"top_logprobs":0)");
    REQUIRE(zero.has_value());
    CHECK_FALSE(zero->want_logprobs);
  }
  SECTION("completions' logprobs name themselves past 20") {
    const auto error = refusal(p.completion(R"(,"logprobs":21)"));
    CHECK(error.param == "logprobs");
    CHECK(error.message == "'logprobs' must be in [0, 20], not 21");
    CHECK(p.completion(R"(,"logprobs":20)").has_value());
  }
}

TEST_CASE("stop strings and stop token ids are bounded", "[net][limits]") {
  Parser p;
  for (const bool chat : {false, true}) {
    auto parse = [&](const std::string& fields) {
      return chat ? p.chat(fields) : p.completion(fields);
    };
    INFO((chat ? "chat" : "completion"));
    CHECK(parse(R"(,"stop":[)" + repeated(R"("ab")", 64) + "]").has_value());
    CHECK(refusal(parse(R"(,"stop":[)" + repeated(R"("ab")", 65) + "]")).param == "stop");
    const std::string longest(512, 'x');
    CHECK(parse(R"(,"stop":")" + longest + R"(")").has_value());
    const auto error = refusal(parse(R"(,"stop":")" + longest + R"(x")"));
    CHECK(error.param == "stop");
    CHECK(error.message == "a stop string may be at most 512 bytes, not 513");
    CHECK(parse(R"(,"stop_token_ids":[)" + repeated("7", 1024) + "]").has_value());
    CHECK(refusal(parse(R"(,"stop_token_ids":[)" + repeated("7", 1025) + "]")).param ==
          "stop_token_ids");
  }
}

TEST_CASE("a socket message's id is at most 256 bytes", "[net][limits]") {
  Parser p;
  auto message = [&](const std::string& id) {
    return net::parse_websocket_message(
        R"({"type":"generate","id":")" + id + R"(","prompt":"Hi","max_tokens":1})", p.context);
  };
  CHECK(message(std::string(256, 'i')).has_value());
  const auto refused = message(std::string(257, 'i'));
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().id.empty());  // not echoed back
  CHECK(refused.error().error.param == "id");
  CHECK(refused.error().error.message == "'id' may be at most 256 bytes, not 257");
}

TEST_CASE("a request's priority is vLLM's: an int32, and not 0 only under priority scheduling",
          "[net][limits]") {
  Parser p;
  SECTION("first come, first served: 0 (or none, or null) passes, anything else is refused") {
    for (const std::string& fields :
         {std::string{}, std::string(R"(,"priority":0)"), std::string(R"(,"priority":null)")}) {
      INFO(fields);
      const auto parsed = p.completion(fields);
      REQUIRE(parsed.has_value());
      CHECK(parsed->generate.priority == 0);
    }
    const auto error = refusal(p.chat(R"(,"priority":-3)"));
    CHECK(error.param == "priority");
    CHECK_THAT(error.message, Catch::Contains("--scheduling-policy priority"));
  }
  SECTION("priority scheduling: the value reaches the engine, in both endpoints") {
    p.context.priority_scheduling = true;
    const auto chat = p.chat(R"(,"priority":-3)");
    REQUIRE(chat.has_value());
    CHECK(chat->generate.priority == -3);
    const auto completion = p.completion(R"(,"priority":2147483647)");
    REQUIRE(completion.has_value());
    CHECK(completion->generate.priority == 2147483647);
    for (const std::string fields : {R"(,"priority":2147483648)", R"(,"priority":1.5)",
                                     R"(,"priority":"high")", R"(,"priority":true)"}) {
      INFO(fields);
      CHECK(refusal(p.completion(fields)).param == "priority");
    }
  }
}
