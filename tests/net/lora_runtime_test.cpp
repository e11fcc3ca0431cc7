// Run-time LoRA adapters over HTTP (issue 33): vLLM's POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter on the llama base model of ../shared/models/archs with its
// adapters (../shared/models/lora). A loaded adapter answers as the same file given at
// start does (greedy text), on every replica and every rank of a split model; an unload is
// a 404 at once for new requests while running ones finish; slots are reused; every bad
// load is a clear 400 that leaves the server as it was; answers name the adapter.
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <future>
#include <thread>

#include "actors/engine_hooks.hpp"
#include "monitoring/metrics.hpp"
#include "net/http_server.hpp"
#include "support/mini_json.hpp"
#include "support/shell.hpp"
#include "support/test_support.hpp"
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

std::string adapter_file(const std::string& name) {
  return test::shared_file("models/lora/" + name + ".gguf");
}

struct Options {
  bool runtime = true;
  std::int32_t max_loras = 2;
  std::int32_t max_lora_rank = 16;
  std::vector<std::pair<std::string, std::string>> modules;  // at start: name, file
  std::int32_t data_parallel = 1;
  std::int32_t tensor_parallel = 1;
  std::chrono::milliseconds step_delay{0};  // each step waits this long first
  std::string api_key;                      // --api-key (the test's curl sends none)
};

struct RuntimeServer {
  explicit RuntimeServer(const Options& o) {
    EngineConfig e;
    e.model_path = test::shared_file("models/archs/llama.gguf");
    e.num_threads = 1;
    e.block_size = 16;
    e.num_kv_blocks = 64;
    e.kv_cache_dtype = KvCacheDtype::f32;
    e.max_loras = o.max_loras;
    e.data_parallel_size = o.data_parallel;
    e.tensor_parallel_size = o.tensor_parallel;
    net::ServerConfig config;
    config.served_model_name = "base";
    config.runtime_lora_updating = o.runtime;
    config.max_lora_rank = o.max_lora_rank;
    config.api_key = o.api_key;
    metrics = std::make_shared<monitoring::Metrics>("base", o.data_parallel);
    std::vector<std::string> names;
    for (const auto& [name, file] : o.modules) {
      e.lora_adapters.push_back(adapter_file(file));
      config.lora_modules.push_back({name, adapter_file(file)});
      names.push_back(name);
    }
    metrics->set_lora_adapters(names);
    e.metrics = metrics;
    config.metrics = metrics;
    EngineHooks hooks;
    if (o.step_delay.count() > 0) {
      hooks.before_step = [delay = o.step_delay] { std::this_thread::sleep_for(delay); };
    }
    auto created = Engine::create(e, hooks);
    INFO((created ? std::string() : created.error().message));
    REQUIRE(created.has_value());
    engine = std::move(*created);
    config.port = 0;
    server = std::make_unique<net::HttpServer>(*engine, config);
    REQUIRE(server->start().has_value());
  }
  ~RuntimeServer() { server->stop(); }

  // curl, the body through a file (a file per call: calls run at once).
  Reply curl(const std::string& path, const std::string& body = {}) const {
    const test::CurlReply r = test::curl(server->port(), path, body);
    return {r.status, r.body};
  }

  Reply load(const std::string& name, const std::string& path) const {
    return curl("/v1/load_lora_adapter",
                R"({"lora_name":")" + name + R"(","lora_path":")" + path + R"("})");
  }
  Reply unload(const std::string& name) const {
    return curl("/v1/unload_lora_adapter", R"({"lora_name":")" + name + R"("})");
  }
  Reply complete(const std::string& model, int max_tokens = 12,
                 const std::string& prompt = "Once upon a time") const {
    return curl("/v1/completions", R"({"model":")" + model + R"(","prompt":")" + prompt +
                                       R"(","max_tokens":)" + std::to_string(max_tokens) +
                                       R"(,"temperature":0,"ignore_eos":true})");
  }

  std::shared_ptr<monitoring::Metrics> metrics;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<net::HttpServer> server;  // declared last: it goes first
};

std::string text_of(const Reply& r) {
  INFO(r.body);
  REQUIRE(r.status == 200);
  return parse(r.body)["choices"].array[0]["text"].string;
}

// The error object's message, checking its status.
std::string error_of(const Reply& r, int status) {
  INFO(r.body);
  CHECK(r.status == status);
  return parse(r.body)["error"]["message"].string;
}

bool says(const std::string& text, const std::string& what) {
  INFO(text);
  return text.find(what) != std::string::npos;
}

std::vector<std::string> model_ids(const RuntimeServer& s) {
  std::vector<std::string> ids;
  for (const auto& m : parse(s.curl("/v1/models").body)["data"].array)
    ids.push_back(m["id"].string);
  return ids;
}

}  // namespace

TEST_CASE("run-time LoRA updating is refused, saying how to turn it on, unless enabled",
          "[net][lora]") {
  Options o;
  o.runtime = false;
  RuntimeServer s(o);
  const std::string attn = adapter_file("llama-attn-r8");
  CHECK(says(error_of(s.load("rt", attn), 400), "--enable-runtime-lora-updating"));
  CHECK(says(error_of(s.unload("rt"), 400), "VLLM_ALLOW_RUNTIME_LORA_UPDATING"));
  CHECK(s.complete("rt").status == 404);
}

TEST_CASE("the run-time LoRA routes are behind the API key as the other /v1 routes",
          "[net][lora]") {
  Options o;
  o.api_key = "secret";
  RuntimeServer s(o);
  CHECK(error_of(s.load("rt", adapter_file("llama-attn-r8")), 401).find("API key") !=
        std::string::npos);
  CHECK(s.unload("rt").status == 401);
  CHECK(s.engine->num_lora_slots() == 2);
}

TEST_CASE("a loaded adapter answers as at start, by its name, until it is unloaded",
          "[net][integration][lora]") {
  Options o;
  o.modules = {{"attn", "llama-attn-r8"}};
  RuntimeServer s(o);
  const std::string start_text = text_of(s.complete("attn"));
  CHECK(start_text != text_of(s.complete("base")));

  const auto loaded = s.load("attn-rt", adapter_file("llama-attn-r8"));
  REQUIRE(loaded.status == 200);
  CHECK(loaded.body == "Success: LoRA adapter 'attn-rt' added successfully.");
  CHECK(text_of(s.complete("attn-rt")) == start_text);
  CHECK(model_ids(s) == std::vector<std::string>{"base", "attn", "attn-rt"});
  const auto listed = parse(s.curl("/v1/models/attn-rt").body);
  CHECK(listed["parent"].string == "base");
  CHECK(listed["root"].string == adapter_file("llama-attn-r8"));
  CHECK(says(s.curl("/metrics").body,
             R"(troupe_lora_requests_running{model_name="base",lora_name="attn-rt"} 0)"));

  INFO("answers name the adapter, as vLLM's do; the base's name the base");
  CHECK(parse(s.complete("attn-rt").body)["model"].string == "attn-rt");
  CHECK(parse(s.complete("base").body)["model"].string == "base");
  const auto chat = s.curl("/v1/chat/completions",
                           R"({"model":"attn-rt","messages":[{"role":"user","content":"hi"}],)"
                           R"("max_tokens":4,"temperature":0})");
  REQUIRE(chat.status == 200);
  CHECK(parse(chat.body)["model"].string == "attn-rt");
  const auto streamed = s.curl("/v1/chat/completions",
                               R"({"model":"attn","messages":[{"role":"user","content":"hi"}],)"
                               R"("max_tokens":4,"temperature":0,"stream":true})");
  REQUIRE(streamed.status == 200);
  int chunks = 0;
  for (std::size_t at = streamed.body.find("data: {"); at != std::string::npos;
       at = streamed.body.find("data: {", at + 1)) {
    const auto end = streamed.body.find('\n', at);
    CHECK(parse(streamed.body.substr(at + 6, end - at - 6))["model"].string == "attn");
    ++chunks;
  }
  CHECK(chunks >= 2);
  const auto response = s.curl("/v1/responses", R"({"model":"attn-rt","input":"hi",)"
                                                R"("max_output_tokens":4,"temperature":0})");
  REQUIRE(response.status == 200);
  CHECK(parse(response.body)["model"].string == "attn-rt");

  const auto unloaded = s.unload("attn-rt");
  REQUIRE(unloaded.status == 200);
  CHECK(unloaded.body == "Success: LoRA adapter 'attn-rt' removed successfully.");
  CHECK(parse(s.complete("attn-rt").body)["error"]["type"].string == "NotFoundError");
  CHECK(s.complete("attn-rt").status == 404);
  CHECK(model_ids(s) == std::vector<std::string>{"base", "attn"});
  CHECK_FALSE(says(s.curl("/metrics").body, R"(lora_name="attn-rt")"));
  CHECK(says(error_of(s.unload("attn-rt"), 404), "cannot be found"));
  // A start-up adapter unloads as well; its text is still the same file's after a reload.
  REQUIRE(s.unload("attn").status == 200);
  CHECK(s.complete("attn").status == 404);
  REQUIRE(s.load("attn", adapter_file("llama-attn-r8")).status == 200);
  CHECK(text_of(s.complete("attn")) == start_text);
}

TEST_CASE("a request running with an adapter finishes after its unload, then its slot is free",
          "[net][integration][lora]") {
  Options o;
  o.max_loras = 1;
  o.step_delay = std::chrono::milliseconds(2);  // 150 tokens: 300 ms at least
  RuntimeServer s(o);
  REQUIRE(s.load("long", adapter_file("llama-all-r16")).status == 200);
  const std::string alone = text_of(s.complete("long", 150));
  auto running = std::async(std::launch::async, [&s] { return s.complete("long", 150); });
  // Unloaded once it runs; the request is not told.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (s.engine->stats().num_running == 0) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  REQUIRE(s.unload("long").status == 200);
  CHECK(s.complete("long").status == 404);
  // Its slot is held until it ends: the one slot is not free yet.
  CHECK(says(error_of(s.load("next", adapter_file("llama-attn-r8")), 400),
             "no free LoRA adapter slot: all 1 (--max-loras) hold an adapter or run requests of "
             "an unloaded one (1 free once they finish)"));
  CHECK(s.engine->stats().num_running == 1);  // it was running all along
  CHECK(text_of(running.get()) == alone);
  REQUIRE(s.load("next", adapter_file("llama-attn-r8")).status == 200);
  CHECK(s.complete("next").status == 200);
}

TEST_CASE("loading and unloading twenty times reuses the slots", "[net][lora]") {
  Options o;
  o.max_loras = 1;
  RuntimeServer s(o);
  REQUIRE(s.load("first", adapter_file("llama-attn-r8")).status == 200);
  const std::string attn = text_of(s.complete("first", 4));
  REQUIRE(s.unload("first").status == 200);
  for (int i = 0; i < 20; ++i) {
    const std::string name = "a" + std::to_string(i);
    // Every other one another file: a slot reused must forget the last one's prefixes.
    const std::string file = i % 2 == 0 ? "llama-all-r16" : "llama-attn-r8";
    INFO(name << " " << file);
    REQUIRE(s.load(name, adapter_file(file)).status == 200);
    const std::string text = text_of(s.complete(name, 4));
    if (i % 2 == 1) CHECK(text == attn);
    if (i % 2 == 0) CHECK(text != attn);
    REQUIRE(s.unload(name).status == 200);
  }
  CHECK(s.engine->num_lora_slots() == 1);
  CHECK(model_ids(s) == std::vector<std::string>{"base"});
}

TEST_CASE("a bad load is a clear 400 and leaves the server as it was", "[net][lora]") {
  Options o;
  o.max_loras = 2;
  o.max_lora_rank = 8;
  o.modules = {{"attn", "llama-attn-r8"}};
  RuntimeServer s(o);
  const std::string attn = adapter_file("llama-attn-r8");
  CHECK(says(error_of(s.curl("/v1/load_lora_adapter", "{"), 400), "not valid JSON"));
  CHECK(says(error_of(s.curl("/v1/load_lora_adapter", R"({"lora_name":"x"})"), 400),
             "'lora_path' must be a non-empty string"));
  CHECK(says(error_of(s.curl("/v1/unload_lora_adapter", R"({"lora_name":5})"), 400),
             "'lora_name' must be a non-empty string"));
  CHECK(says(error_of(s.load("x", "/no/such.gguf"), 400), "(/no/such.gguf): no such file"));
  CHECK(says(error_of(s.load("x", test::shared_file("models/archs/llama.gguf")), 400),
             "is not a LoRA adapter GGUF"));
  // Another model's adapter: the worker reads it and refuses it, and holds nothing after.
  const auto other = error_of(s.load("x", adapter_file("qwen2-qv-r4")), 400);
  CHECK(says(other, "LoRA adapter 'x': LoRA adapter " + adapter_file("qwen2-qv-r4")));
  CHECK(says(other, "the adapter is for architecture qwen2, the base model is llama"));
  CHECK(says(error_of(s.load("x", adapter_file("llama-all-r16")), 400),
             "has rank 16, more than --max-lora-rank 8"));
  CHECK(says(error_of(s.load("attn", attn), 400), "The lora adapter 'attn' has already been"));
  CHECK(says(error_of(s.load("base", attn), 400), "is the served model's"));
  CHECK(model_ids(s) == std::vector<std::string>{"base", "attn"});
  // The failed loads took no slot: one is left of two, and then none.
  REQUIRE(s.load("x", attn).status == 200);
  CHECK(says(error_of(s.load("y", attn), 400), "no free LoRA adapter slot: all 2 (--max-loras)"));
  CHECK(text_of(s.complete("x")) == text_of(s.complete("attn")));
}

TEST_CASE("a loaded adapter reaches every replica and every rank of a split model",
          "[net][integration][lora][parallel]") {
  for (const auto& [dp, tp] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}}) {
    INFO("data parallel " << dp << ", tensor parallel " << tp);
    Options o;
    o.data_parallel = dp;
    o.tensor_parallel = tp;
    o.modules = {{"attn", "llama-attn-r8"}};
    RuntimeServer s(o);
    REQUIRE(s.load("attn-rt", adapter_file("llama-attn-r8")).status == 200);
    const std::string want = text_of(s.complete("attn"));
    // At once: with two replicas, both serve some.
    std::vector<std::future<Reply>> replies;
    for (int i = 0; i < 4; ++i) {
      replies.push_back(std::async(std::launch::async, [&s] { return s.complete("attn-rt"); }));
    }
    for (auto& r : replies) CHECK(text_of(r.get()) == want);
    REQUIRE(s.unload("attn-rt").status == 200);
    CHECK(s.complete("attn-rt").status == 404);
  }
}
