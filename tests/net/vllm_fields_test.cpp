// The fields vLLM's users send, honoured where they mean something here and refused,
// naming the field, where they cannot be: the template's inputs (developer, content
// parts, documents, continue_final_message, reasoning_effort), truncate_prompt_tokens,
// echo with max_tokens 0 (prompt scoring), skip_special_tokens and
// include_stop_str_in_output.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "net/openai_api.hpp"
#include "net_test_support.hpp"
#include "support/mini_json.hpp"
#include "support/raw_client.hpp"

using namespace troupe;

namespace {

// Every input the template reads shows in its output.
const std::string kTemplate =
    "{%- for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{%- if documents %}[docs:{% for d in documents %} {{ d.title }}={{ d.text }}{% endfor "
    "%}]{% endif %}"
    "{%- if reasoning_effort is defined %}[effort {{ reasoning_effort }}]{% endif %}"
    "{%- if add_generation_prompt %}<assistant>{% endif %}";

struct Served : test::ServedEngine {
  Served() : ServedEngine("vllm-fields", config(), 256, 128) {}

  std::pair<int, std::string> post(const std::string& path, const std::string& body) {
    test::RawClient client(server->port());
    REQUIRE(client.connected());
    REQUIRE(client.send("POST " + path +
                        " HTTP/1.1\r\nHost: test\r\n"
                        "Content-Type: application/json\r\nConnection: close\r\n"
                        "Content-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body));
    const std::string reply = client.read_all(std::chrono::seconds(30));
    const auto head_end = reply.find("\r\n\r\n");
    REQUIRE(head_end != std::string::npos);
    return {test::http_status(reply), reply.substr(head_end + 4)};
  }
  // A completion's first choice's text, which must be answered with 200.
  std::string text(const std::string& body) {
    const auto [status, reply] = post("/v1/completions", body);
    INFO(body << "\n" << reply);
    REQUIRE(status == 200);
    return test::JsonParser(reply).parse()["choices"].array.at(0)["text"].string;
  }

  static net::ServerConfig config() {
    net::ServerConfig c;
    c.chat_template = kTemplate;
    c.chat_template_origin = "the test's template";
    return c;
  }
};

template <class Parsed>
net::ApiError refusal(const Parsed& parsed) {
  REQUIRE_FALSE(parsed.has_value());
  CHECK(parsed.error().status == 400);
  return parsed.error();
}

}  // namespace

TEST_CASE("developer, content parts, documents and reasoning_effort reach the chat template",
          "[net][chat][vllm]") {
  Served s;
  const auto& tokenizer = s.engine->tokenizer();
  const auto context = net::make_api_context(tokenizer, 256, "troupe", kTemplate);
  const auto request = net::parse_chat_request(
      R"({"messages":[{"role":"developer","content":"Be nice"},)"
      R"({"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"there"}]}],)"
      R"("documents":[{"title":"a","text":"b"}],"reasoning_effort":"low","max_tokens":2})",
      context);
  INFO((request ? std::string() : request.error().message));
  REQUIRE(request.has_value());
  CHECK(request->generate.prompt ==
        tokenizer.encode("<system>Be nice</system><user>Hi\nthere</user>[docs: a=b][effort low]"
                         "<assistant>",
                         true, true));
  // chat_template_kwargs' own reasoning_effort wins over the field.
  const auto kwargs = net::parse_chat_request(
      R"({"messages":[{"role":"user","content":"Hi"}],"reasoning_effort":"low",)"
      R"("chat_template_kwargs":{"reasoning_effort":"high"}})",
      context);
  REQUIRE(kwargs.has_value());
  CHECK(kwargs->generate.prompt ==
        tokenizer.encode("<user>Hi</user>[effort high]<assistant>", true, true));
  // Over HTTP too.
  const auto [status, body] =
      s.post("/v1/chat/completions", R"({"messages":[{"role":"developer","content":"x"}],)"
                                     R"("documents":[],"reasoning_effort":"high","max_tokens":2})");
  INFO(body);
  CHECK(status == 200);
}

TEST_CASE("continue_final_message ends the prompt inside the final message", "[net][chat][vllm]") {
  Served s;
  const auto& tokenizer = s.engine->tokenizer();
  const auto context = net::make_api_context(tokenizer, 256, "troupe", kTemplate);
  // add_generation_prompt is false by default beside it, and may be said so.
  for (const std::string add : {"", R"(,"add_generation_prompt":false)"}) {
    INFO(add);
    const auto request = net::parse_chat_request(
        R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Once upon"}],)"
        R"("continue_final_message":true)" +
            add + "}",
        context);
    INFO((request ? std::string() : request.error().message));
    REQUIRE(request.has_value());
    CHECK(request->generate.prompt ==
          tokenizer.encode("<user>Hi</user><assistant>Once upon", true, true));
  }
  // The built-in renderers continue it too (ChatML here).
  const auto chatml = net::make_api_context(tokenizer, 256, "troupe", "");
  const auto plain = net::parse_chat_request(
      R"({"messages":[{"role":"assistant","content":"Once upon"}],"continue_final_message":true})",
      chatml);
  REQUIRE(plain.has_value());
  CHECK(plain->generate.prompt == tokenizer.encode("<|im_start|>assistant\nOnce upon", true, true));
  const auto both = refusal(net::parse_chat_request(
      R"({"messages":[{"role":"assistant","content":"Once"}],"continue_final_message":true,)"
      R"("add_generation_prompt":true})",
      context));
  CHECK(both.param == "continue_final_message");
  const auto empty = refusal(net::parse_chat_request(
      R"({"messages":[{"role":"assistant","content":null}],"continue_final_message":true})",
      context));
  CHECK_THAT(empty.message, Catch::Contains("continue_final_message"));
}

TEST_CASE("what the template cannot be given is refused, naming the field", "[net][chat][vllm]") {
  Served s;
  const auto& tokenizer = s.engine->tokenizer();
  const auto context = net::make_api_context(tokenizer, 256, "troupe", kTemplate);
  auto chat = [&context](const std::string& fields) {
    return net::parse_chat_request(R"({"messages":[{"role":"user","content":"Hi"}])" + fields + "}",
                                   context);
  };
  const auto image = refusal(net::parse_chat_request(
      R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
      context));
  CHECK(image.param == "messages");
  CHECK_THAT(image.message, Catch::Contains("'image_url'"));
  CHECK(refusal(chat(R"(,"reasoning_effort":"extreme")")).param == "reasoning_effort");
  CHECK(refusal(chat(R"(,"documents":"text")")).param == "documents");
  CHECK(refusal(chat(R"(,"documents":[1])")).param == "documents");
  CHECK(refusal(chat(R"(,"continue_final_message":"yes")")).param == "continue_final_message");
  CHECK(refusal(chat(R"(,"skip_special_tokens":1)")).param == "skip_special_tokens");
  // The built-in renderer has no place for documents: refused, not dropped.
  const auto chatml = net::make_api_context(tokenizer, 256, "troupe", "");
  CHECK(refusal(
            net::parse_chat_request(
                R"({"messages":[{"role":"user","content":"Hi"}],"documents":[{"a":"b"}]})", chatml))
            .param == "documents");
  // A field troupe does not know is still refused, naming it.
  const auto unknown = refusal(chat(R"(,"use_beam_search":true)"));
  CHECK(unknown.param == "use_beam_search");
  // vLLM's fields at their defaults are accepted.
  CHECK(chat(R"(,"skip_special_tokens":true,"spaces_between_special_tokens":true,)"
             R"("include_stop_str_in_output":false,"truncate_prompt_tokens":null)")
            .has_value());
}

TEST_CASE("truncate_prompt_tokens keeps a prompt's last tokens", "[net][vllm]") {
  Served s;
  const auto& tokenizer = s.engine->tokenizer();
  const auto context = net::make_api_context(tokenizer, 256, "troupe", kTemplate);
  const auto cut = net::parse_completion_request(
      R"({"prompt":[5,6,7,8,9],"truncate_prompt_tokens":2,"max_tokens":1})", context);
  REQUIRE(cut.has_value());
  CHECK(cut->generate.prompt == std::vector<TokenId>{8, 9});
  const auto whole = net::parse_completion_request(
      R"({"prompt":[5,6,7],"truncate_prompt_tokens":-1,"max_tokens":1})", context);
  REQUIRE(whole.has_value());
  CHECK(whole->generate.prompt == std::vector<TokenId>{5, 6, 7});
  const auto chat = net::parse_chat_request(
      R"({"messages":[{"role":"user","content":"Hi there"}],"truncate_prompt_tokens":3})", context);
  REQUIRE(chat.has_value());
  const auto full = tokenizer.encode("<user>Hi there</user><assistant>", true, true);
  CHECK(chat->generate.prompt == std::vector<TokenId>(full.end() - 3, full.end()));
  for (const std::string k : {"0", "-2", "257"}) {
    INFO(k);
    CHECK(refusal(net::parse_completion_request(
                      R"({"prompt":[5,6],"truncate_prompt_tokens":)" + k + "}", context))
              .param == "truncate_prompt_tokens");
  }
  // A prompt too long for the context fits once truncated; echo shows what was kept.
  const std::string long_prompt = [] {
    std::string ids;
    for (int i = 0; i < 300; ++i) ids += (i == 0 ? "" : ",") + std::to_string(300 + i % 100);
    return ids;
  }();
  const auto [status, body] =
      s.post("/v1/completions", R"({"prompt":[)" + long_prompt +
                                    R"(],"truncate_prompt_tokens":4,"max_tokens":2,"echo":true})");
  INFO(body);
  REQUIRE(status == 200);
  const auto reply = test::JsonParser(body).parse();
  CHECK(reply["usage"]["prompt_tokens"].number == 4);
  const std::vector<TokenId> kept{396, 397, 398, 399};
  CHECK_THAT(reply["choices"].array.at(0)["text"].string,
             Catch::StartsWith(tokenizer.decode(kept)));
}

TEST_CASE("echo with max_tokens 0 scores the prompt and generates nothing", "[net][vllm]") {
  Served s;
  const std::string prompt = "the little girl";
  for (const std::string stream : {"false", "true"}) {
    INFO("stream " << stream);
    const auto [status, body] =
        s.post("/v1/completions", R"({"prompt":")" + prompt +
                                      R"(","max_tokens":0,"echo":true,"logprobs":1,"stream":)" +
                                      stream + R"(,"stream_options":{"include_usage":true}})");
    INFO(body);
    REQUIRE(status == 200);
    if (stream == "false") {
      const auto reply = test::JsonParser(body).parse();
      const auto& choice = reply["choices"].array.at(0);
      CHECK(choice["text"].string == prompt);
      CHECK(choice["finish_reason"].string == "length");
      // One logprob per prompt token (the first has none), none of a generated token.
      const auto num_prompt = reply["usage"]["prompt_tokens"].number;
      CHECK(choice["logprobs"]["tokens"].array.size() == static_cast<std::size_t>(num_prompt));
      CHECK(reply["usage"]["completion_tokens"].number == 0);
    } else {
      // The echo, then the end with nothing generated, and usage without output tokens.
      CHECK_THAT(body, Catch::Contains(R"("text":")" + prompt + "\""));
      CHECK_THAT(body, Catch::Contains(R"("text":"","logprobs":null,"finish_reason":"length")"));
      CHECK_THAT(body, Catch::Contains(R"("completion_tokens":0)"));
      CHECK_THAT(body, Catch::Contains("data: [DONE]"));
    }
  }
  // Without echo, or on chat, max_tokens 0 asks for nothing: refused.
  CHECK(s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":0})").first == 400);
  CHECK(s.post("/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":0})")
            .first == 400);
  CHECK(s.post("/v1/completions", R"({"prompt":"Hi","max_tokens":0,"echo":true,"best_of":2})")
            .first == 400);
  CHECK(s.kv_drains());
}

TEST_CASE("skip_special_tokens false shows control tokens, include_stop_str_in_output the stop",
          "[net][vllm]") {
  Served s;
  // <s> (1) forced by logit_bias: a control token, shown only when asked.
  const std::string bos = R"("prompt":"Hi","max_tokens":3,"temperature":0,"logit_bias":{"1":100})";
  CHECK(s.text("{" + bos + "}").empty());
  CHECK(s.text("{" + bos + R"(,"skip_special_tokens":false})") == "<s><s><s>");
  // </s> (2, EOS) ends the sequence: its text shows only with include_stop_str_in_output.
  const std::string eos = R"("prompt":"Hi","max_tokens":3,"temperature":0,"logit_bias":{"2":100})";
  CHECK(s.text("{" + eos + R"(,"skip_special_tokens":false})").empty());
  CHECK(s.text("{" + eos + R"(,"skip_special_tokens":false,"include_stop_str_in_output":true})") ==
        "</s>");
  // A stop string is cut, or kept with include_stop_str_in_output; the text ends there.
  // A word forced at every step makes the text known: " word word word ...".
  const auto& vocab = s.engine->tokenizer().vocabulary();
  const std::string space = "\xe2\x96\x81";
  std::string word;
  TokenId id = kNoToken;
  for (std::size_t i = 0; i < vocab.size() && id == kNoToken; ++i) {
    const std::string& t = vocab.tokens[i];
    if (t.size() >= space.size() + 3 && t.starts_with(space) &&
        std::all_of(t.begin() + 3, t.end(), [](char c) { return c >= 'a' && c <= 'z'; })) {
      id = static_cast<TokenId>(i);
      word = t.substr(space.size());
    }
  }
  REQUIRE(id != kNoToken);
  const std::string forced = R"("prompt":"Once upon","max_tokens":6,"temperature":0,)"
                             R"("ignore_eos":true,"logit_bias":{")" +
                             std::to_string(id) + R"(":100})";
  const std::string whole = s.text("{" + forced + "}");
  std::string expected;
  for (int i = 0; i < 6; ++i) expected += " " + word;
  REQUIRE(whole == expected);
  const std::string stop = word.substr(1) + " " + word.substr(0, 1);  // across two tokens
  const std::size_t at = whole.find(stop);
  const std::string stops = R"(,"stop":[")" + stop + R"("])";
  CHECK(s.text("{" + forced + stops + "}") == whole.substr(0, at));
  CHECK(s.text("{" + forced + stops + R"(,"include_stop_str_in_output":true})") ==
        whole.substr(0, at + stop.size()));
  CHECK(s.kv_drains());
}

TEST_CASE("/tokenize takes messages and answers a chat request's prompt tokens", "[net][vllm]") {
  Served s;
  const auto& tokenizer = s.engine->tokenizer();
  const std::string messages =
      R"("messages":[{"role":"developer","content":"Be nice"},{"role":"user","content":"Hi"}])";
  const auto [status, body] = s.post("/tokenize", "{" + messages + "}");
  INFO(body);
  REQUIRE(status == 200);
  const auto expected =
      tokenizer.encode("<system>Be nice</system><user>Hi</user><assistant>", true, true);
  const auto reply = test::JsonParser(body).parse();
  CHECK(reply["tokens"].ints() == std::vector<int>(expected.begin(), expected.end()));
  CHECK(reply["count"].number == static_cast<double>(expected.size()));
  // Without the generation prompt, as a chat request would be.
  const auto [status2, body2] =
      s.post("/tokenize", "{" + messages + R"(,"add_generation_prompt":false})");
  REQUIRE(status2 == 200);
  const auto without = tokenizer.encode("<system>Be nice</system><user>Hi</user>", true, true);
  CHECK(test::JsonParser(body2).parse()["tokens"].ints() ==
        std::vector<int>(without.begin(), without.end()));
  // One or the other.
  CHECK(s.post("/tokenize", R"({"prompt":"Hi",)" + messages + "}").first == 400);
  CHECK(s.post("/tokenize", R"({"messages":[]})").first == 400);
}
