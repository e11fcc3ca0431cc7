// Multi-LoRA serving over HTTP (issue 33): the llama base model of ../shared/models/archs and
// two of its adapters (../shared/models/lora) served at once under their names. Each name's
// greedy output is llama.cpp's (../shared/golden/lora, ../shared/golden/archs: the tokens
// up to the reference's first low-margin step), and every request sent at once, adapters
// mixed in one batch, gives what it gives alone. /v1/models lists each adapter with its
// parent and root (vLLM's shape); an unknown name is vLLM's 404.
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <future>
#include <thread>

#include "monitoring/metrics.hpp"
#include "net/http_server.hpp"
#include "net/openai_api.hpp"
#include "support/mini_json.hpp"
#include "support/shell.hpp"
#include "support/test_support.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode.hpp"
#include "troupe/engine.hpp"

using namespace troupe;

namespace {

struct Reply {
  int status = 0;
  std::string body;
};

test::Json parse(const std::string& s) {
  return test::JsonParser(s).parse();
}

const std::array<std::string, 2> kAdapters = {"llama-attn-r8", "llama-all-r16"};

struct LoraServer {
  LoraServer() {
    EngineConfig e;
    e.model_path = test::shared_file("models/archs/llama.gguf");
    e.num_threads = 2;
    e.block_size = 16;
    e.num_kv_blocks = 128;
    e.kv_cache_dtype = KvCacheDtype::f32;  // as the references
    net::ServerConfig config;
    config.served_model_name = "base";
    metrics = std::make_shared<monitoring::Metrics>("base");
    metrics->set_lora_adapters({kAdapters.begin(), kAdapters.end()});
    e.metrics = metrics;
    config.metrics = metrics;
    for (const auto& name : kAdapters) {
      const std::string path = test::shared_file("models/lora/" + name + ".gguf");
      e.lora_adapters.push_back(path);
      config.lora_modules.push_back({name, path});
    }
    auto created = Engine::create(e);
    INFO((created ? std::string() : created.error().message));
    REQUIRE(created.has_value());
    engine = std::move(*created);
    config.port = 0;
    server = std::make_unique<net::HttpServer>(*engine, config);
    REQUIRE(server->start().has_value());
  }
  ~LoraServer() { server->stop(); }

  // curl, the body through a file (a file per call: calls run at once).
  Reply curl(const std::string& path, const std::string& body = {}) const {
    const test::CurlReply r = test::curl(server->port(), path, body);
    return {r.status, r.body};
  }

  std::shared_ptr<monitoring::Metrics> metrics;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<net::HttpServer> server;  // declared last: it goes first
};

struct Case {
  std::string model;       // the API name
  test::Json golden_case;  // the reference's prompt record
};

std::vector<Case> cases() {
  std::vector<Case> all;
  const auto add = [&](const std::string& model, const std::string& golden) {
    const auto g = parse(test::read_text(test::shared_file("golden/" + golden)));
    for (const auto& p : g["prompts"].array) all.push_back({model, p});
  };
  add("base", "archs/llama.json");
  for (const auto& name : kAdapters) add(name, "lora/" + name + ".json");
  return all;
}

std::string body_of(const Case& c) {
  std::string prompt;
  for (int id : c.golden_case["prompt_ids"].ints()) {
    prompt += (prompt.empty() ? "" : ",") + std::to_string(id);
  }
  return R"({"model":")" + c.model + R"(","prompt":[)" + prompt +
         R"(],"max_tokens":32,"temperature":0,"ignore_eos":true,"logprobs":0})";
}

// The output's tokens (their text, as the response gives them).
std::vector<std::string> tokens_of(const Reply& r) {
  INFO(r.body);
  REQUIRE(r.status == 200);
  std::vector<std::string> tokens;
  const auto response = parse(r.body);  // kept: the loop below walks into it
  for (const auto& t : response["choices"].array[0]["logprobs"]["tokens"].array) {
    tokens.push_back(t.string);
  }
  return tokens;
}

}  // namespace

TEST_CASE("the base model and its LoRA adapters are served at once under their names",
          "[net][integration][lora]") {
  LoraServer s;
  const auto all = cases();
  std::vector<std::vector<std::string>> alone;
  for (const auto& c : all) {
    INFO(c.model << " prompt " << c.golden_case["name"].string << " alone");
    alone.push_back(tokens_of(s.curl("/v1/completions", body_of(c))));
    const auto want = c.golden_case["output_ids"].ints();
    REQUIRE(alone.back().size() == want.size());
    const auto& low = c.golden_case["first_low_margin_step"];
    const std::size_t exact =
        low.kind == test::Json::Kind::null ? want.size() : static_cast<std::size_t>(low.number);
    for (std::size_t k = 0; k < exact; ++k) {
      INFO("token " << k);
      CHECK(alone.back()[k] ==
            text::to_valid_utf8(s.engine->tokenizer().piece(static_cast<TokenId>(want[k]))));
    }
  }
  // The base and adapter outputs differ (an adapter that did nothing would pass above only
  // if the references were the base's).
  CHECK(alone[0] != alone[4]);

  INFO("every request at once, the adapters mixed in the batches");
  std::vector<std::future<Reply>> replies;
  for (const auto& c : all) {
    replies.push_back(std::async(
        std::launch::async, [&s, body = body_of(c)] { return s.curl("/v1/completions", body); }));
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    INFO(all[i].model << " prompt " << all[i].golden_case["name"].string << " together");
    CHECK(tokens_of(replies[i].get()) == alone[i]);
  }
  // Each adapter's series, back at 0 once its requests ended (the engine's counts by slot
  // are tested in tests/engine/engine_core_test.cpp, the sums in metrics_test.cpp).
  const auto exposition = s.curl("/metrics").body;
  for (const auto& name : kAdapters) {
    for (const std::string which : {"running", "waiting"}) {
      INFO(exposition);
      CHECK(exposition.find("troupe_lora_requests_" + which + R"({model_name="base",lora_name=")" +
                            name + "\"} 0\n") != std::string::npos);
    }
  }
}

TEST_CASE("/v1/models lists the adapters, chat takes an adapter's name, an unknown name is 404",
          "[net][integration][lora]") {
  LoraServer s;
  const auto listed = parse(s.curl("/v1/models").body);
  const auto& models = listed["data"].array;
  REQUIRE(models.size() == 3);
  CHECK(models[0]["id"].string == "base");
  CHECK(models[0]["parent"].kind == test::Json::Kind::null);
  for (std::size_t i = 0; i < kAdapters.size(); ++i) {
    CHECK(models[i + 1]["id"].string == kAdapters[i]);
    CHECK(models[i + 1]["parent"].string == "base");
    CHECK(models[i + 1]["root"].string ==
          test::shared_file("models/lora/" + kAdapters[i] + ".gguf"));
  }
  const auto one = parse(s.curl("/v1/models/llama-all-r16").body);
  CHECK(one["parent"].string == "base");

  const auto chat = [&](const std::string& model) {
    return s.curl("/v1/chat/completions",
                  R"({"model":")" + model +
                      R"(","messages":[{"role":"user","content":"hi"}],"max_tokens":8,)"
                      R"("temperature":0,"ignore_eos":true})");
  };
  const auto base = chat("base"), adapted = chat("llama-all-r16");
  REQUIRE(base.status == 200);
  REQUIRE(adapted.status == 200);
  CHECK(parse(base.body)["choices"].array[0]["message"]["content"].string !=
        parse(adapted.body)["choices"].array[0]["message"]["content"].string);
  const auto again = chat("base");
  REQUIRE(again.status == 200);
  CHECK(parse(again.body)["choices"].array[0]["message"]["content"].string ==
        parse(base.body)["choices"].array[0]["message"]["content"].string);

  const auto unknown = chat("no-such-adapter");
  CHECK(unknown.status == 404);
  CHECK(parse(unknown.body)["error"]["type"].string == "NotFoundError");
}

TEST_CASE("a WebSocket generate and a completion naming an adapter run with its slot",
          "[net][lora]") {
  LoraServer s;
  auto context = net::make_api_context(s.engine->tokenizer(), 512, "base", "");
  for (std::size_t i = 0; i < kAdapters.size(); ++i) {
    context.loras->add({kAdapters[i], kAdapters[i] + ".gguf", static_cast<std::int32_t>(i + 1)});
  }
  const auto socket = [&](const std::string& model) {
    return net::parse_websocket_message(
        R"({"type":"generate","id":"g","model":")" + model + R"(","prompt":[1,2,3]})", context);
  };
  for (const auto& [model, slot] : std::vector<std::pair<std::string, int>>{
           {"base", 0}, {"llama-attn-r8", 1}, {"llama-all-r16", 2}}) {
    INFO(model);
    const auto m = socket(model);
    REQUIRE(m.has_value());
    CHECK(m->request.generate.lora_adapter == slot);
    const auto c =
        net::parse_completion_request(R"({"model":")" + model + R"(","prompt":[1,2,3]})", context);
    REQUIRE(c.has_value());
    CHECK(c->generate.lora_adapter == slot);
  }
  // No model named: the base.
  const auto unnamed = net::parse_completion_request(R"({"prompt":[1,2,3]})", context);
  REQUIRE(unnamed.has_value());
  CHECK(unnamed->generate.lora_adapter == 0);
  const auto unknown = socket("llama-none");
  REQUIRE_FALSE(unknown.has_value());
  CHECK(unknown.error().error.status == 404);
}
