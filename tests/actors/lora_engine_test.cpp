// LoRA adapters through the Engine, end to end: EngineConfig::lora_adapters loaded by the
// worker, GenerateRequest::lora_adapter choosing one per request. Each request's greedy
// ids are llama.cpp's with its adapter (../shared/golden/lora) or without
// (../shared/golden/archs), all requests at once; the same prompts run first under the
// base model leave prefix-cache blocks that the adapters' requests must not use.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include "support/mini_json.hpp"
#include "support/test_support.hpp"
#include "troupe/engine.hpp"

using namespace troupe;

namespace {

class Outputs {
 public:
  TokenCallback callback() {
    return [this](const TokenEvent& e) {
      std::lock_guard lock(mutex_);
      if (e.token != kNoToken) ids_[e.request_id].push_back(e.token);
      if (e.finished) {
        ++num_finished_;
        done_.notify_all();
      }
    };
  }
  bool wait(std::size_t n) {
    std::unique_lock lock(mutex_);
    return done_.wait_for(lock, std::chrono::seconds(60), [&] { return num_finished_ >= n; });
  }
  std::vector<int> of(RequestId id) {
    std::lock_guard lock(mutex_);
    const auto& ids = ids_[id];
    return {ids.begin(), ids.end()};
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<RequestId, std::vector<TokenId>> ids_;
  std::size_t num_finished_ = 0;
};

test::Json golden(const std::string& relative) {
  return test::JsonParser(test::read_text(test::shared_file("golden/" + relative))).parse();
}

GenerateRequest request_for(const test::Json& prompt, std::int32_t adapter) {
  GenerateRequest r;
  for (int id : prompt["prompt_ids"].ints()) r.prompt.push_back(id);
  r.params.temperature = 0.0f;
  r.params.max_tokens = 32;
  r.params.ignore_eos = true;
  r.lora_adapter = adapter;
  return r;
}

std::vector<int> comparable(const std::vector<int>& ids, const test::Json& prompt) {
  const test::Json& low = prompt["first_low_margin_step"];
  const std::size_t k =
      low.kind == test::Json::Kind::null ? ids.size() : static_cast<std::size_t>(low.number);
  return {ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(k, ids.size()))};
}

}  // namespace

TEST_CASE("an engine serves the base model and its LoRA adapters at once, as llama.cpp does",
          "[engine][lora][shared]") {
  EngineConfig config;
  config.model_path = test::shared_file("models/archs/llama.gguf");
  config.lora_adapters = {test::shared_file("models/lora/llama-attn-r8.gguf"),
                          test::shared_file("models/lora/llama-all-r16.gguf")};
  config.num_threads = 2;
  config.block_size = 4;
  config.num_kv_blocks = 512;
  config.kv_cache_dtype = KvCacheDtype::f32;  // as the references
  auto engine = Engine::create(config);
  INFO((engine ? std::string() : engine.error().message));
  REQUIRE(engine.has_value());
  const std::vector<test::Json> goldens = {golden("archs/llama.json"),
                                           golden("lora/llama-attn-r8.json"),
                                           golden("lora/llama-all-r16.json")};
  Outputs outputs;
  // The base model's prompts first: their blocks enter the prefix cache.
  std::map<RequestId, std::pair<std::size_t, std::size_t>> which;  // (slot, prompt)
  const auto submit = [&](std::size_t slot) {
    const auto& prompts = goldens[slot]["prompts"].array;
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      auto id = (*engine)->submit(request_for(prompts[p], static_cast<std::int32_t>(slot)),
                                  outputs.callback());
      REQUIRE(id.has_value());
      which[*id] = {slot, p};
    }
  };
  submit(0);
  REQUIRE(outputs.wait(4));
  // Then the same prompts under both adapters, all at once.
  submit(1);
  submit(2);
  REQUIRE(outputs.wait(12));
  for (const auto& [id, at] : which) {
    const auto& prompt = goldens[at.first]["prompts"].array[at.second];
    INFO("slot " << at.first << ", prompt " << prompt["name"].string);
    const auto got = outputs.of(id);
    REQUIRE(got.size() == 32u);
    CHECK(comparable(got, prompt) == comparable(prompt["output_ids"].ints(), prompt));
  }
  GenerateRequest bad = request_for(goldens[0]["prompts"].array[0], 3);
  auto refused = (*engine)->submit(bad, outputs.callback());
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().message.find("LoRA adapter slot 3 holds no adapter") != std::string::npos);
}
