// A model cut into pipeline stages (threads of this process, the hidden states passed on
// over Gloo on loopback) computes bit for bit what the whole model computes: stories260K
// and the architecture references (../shared/golden/archs), cut into 2 and 3 balanced
// stages and by a given layer partition, with F32 and F16 KV caches; each stage holds only
// its layers' weights and KV cache.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>

#include "golden/golden_support.hpp"
#include "model/rendezvous_stores.hpp"
#include "worker/backend_factory.hpp"

using namespace troupe;

namespace {

using test::Json;
using test::JsonParser;
using test::read_text;

// The stages of one pipeline, each a thread's worker model with its KV cache allocated;
// with `ranks` > 1, each stage a tensor-parallel group of that many ranks (stage by stage,
// rank 0 first).
Result<std::vector<model::LoadedModel>> load_stages(const std::string& path,
                                                    std::int32_t num_stages,
                                                    const std::vector<std::int32_t>& partition,
                                                    KvCacheDtype kv_dtype, std::int32_t ranks = 1) {
  model::InProcessStore store;
  static int formation = 0;
  worker::GroupLink link;
  link.store = &store;
  link.prefix = "pp-test-" + std::to_string(++formation);
  link.timeout = std::chrono::seconds(20);
  std::vector<std::future<Result<model::LoadedModel>>> loading;
  for (std::int32_t w = 0; w < num_stages * ranks; ++w) {
    loading.push_back(std::async(std::launch::async, [&, w]() -> Result<model::LoadedModel> {
      engine::WorkerSpec spec;
      spec.model_path = path;
      spec.num_threads = ranks > 1 ? 1 : 2;
      spec.rank = w % ranks;
      spec.world_size = ranks;
      spec.pipeline_stage = w / ranks;
      spec.pipeline_size = num_stages;
      spec.layer_partition = partition;
      TROUPE_TRY(auto m, worker::open_model(spec, &link));
      m.kv_dtype = kv_dtype;
      TROUPE_TRY_VOID(m.allocate_kv_cache(64, 16));
      return m;
    }));
  }
  std::vector<model::LoadedModel> stages;
  std::optional<Error> failed;
  for (auto& stage : loading) {
    auto m = stage.get();
    if (!m && !failed) failed = m.error();
    if (m) stages.push_back(std::move(*m));
  }
  if (failed) return tl::make_unexpected(*failed);
  return stages;
}

struct Cut {
  std::int32_t stages = 1;
  std::vector<std::int32_t> partition;  // empty: balanced
};

std::vector<model::LlamaModel*> models_of(std::vector<model::LoadedModel>& loaded) {
  std::vector<model::LlamaModel*> models;
  for (auto& m : loaded) models.push_back(m.model.get());
  return models;
}

// Every request together, then in prefill chunks of 5: the stages' tokens and first-step
// logits are the whole model's, bit for bit; with `ranks` > 1, each stage a tensor-parallel
// group of that many ranks, and they are the bits of the model split over that many ranks
// unstaged (whose sums they add in the same order).
void check_stages(const std::string& path, const std::vector<test::GenerationRequest>& requests,
                  const std::vector<TokenId>& end_of_generation, const std::vector<Cut>& cuts,
                  std::int32_t ranks = 1) {
  for (const auto kv_dtype : {KvCacheDtype::f32, KvCacheDtype::f16}) {
    auto whole = test::LoadedTestModel::open(path, 64, 16, 2, kv_dtype);
    const std::int32_t num_layers = whole.config.num_layers;
    std::vector<model::LoadedModel> split;  // the unstaged group's ranks
    if (ranks > 1) {
      auto loaded = load_stages(path, 1, {}, kv_dtype, ranks);
      REQUIRE(loaded.has_value());
      split = std::move(*loaded);
    }
    test::BatchGenerator whole_run = ranks > 1
                                         ? test::BatchGenerator(models_of(split), end_of_generation)
                                         : test::BatchGenerator(*whole.model, end_of_generation);
    const std::int64_t rank_bytes =
        ranks > 1 ? split.front().model->weight_bytes() : whole.model->weight_bytes();
    for (const Cut& cut : cuts) {
      INFO(path << ": " << cut.stages << " stages of " << ranks << " rank(s), partition of "
                << cut.partition.size() << ", " << (kv_dtype == KvCacheDtype::f32 ? "F32" : "F16")
                << " KV cache");
      auto stages = load_stages(path, cut.stages, cut.partition, kv_dtype, ranks);
      REQUIRE(stages.has_value());
      const std::vector<model::LlamaModel*> models = models_of(*stages);
      std::int32_t layers = 0;
      for (std::size_t w = 0; w < stages->size(); ++w) {
        const auto& s = (*stages)[w];
        // Each stage's cache and weights are its layers' alone.
        CHECK(s.backend->kv_cache_shape().num_layers == s.model->num_stage_layers());
        CHECK(s.model->weight_bytes() < rank_bytes);
        if (w % static_cast<std::size_t>(ranks) == 0) layers += s.model->num_stage_layers();
      }
      CHECK(layers == num_layers);
      if (!cut.partition.empty()) {
        for (std::size_t w = 0; w < stages->size(); ++w) {
          CHECK((*stages)[w].model->num_stage_layers() ==
                cut.partition[w / static_cast<std::size_t>(ranks)]);
        }
      }
      for (const std::int32_t chunk : {0, 5}) {
        INFO("prefill chunk " << chunk);
        auto expected = whole_run.run(requests, chunk);
        REQUIRE(expected.has_value());
        auto got = test::BatchGenerator(models, end_of_generation).run(requests, chunk);
        REQUIRE(got.has_value());
        for (std::size_t i = 0; i < requests.size(); ++i) {
          CHECK((*got)[i].output == (*expected)[i].output);
          const auto& a = (*got)[i].first_logits;
          const auto& b = (*expected)[i].first_logits;
          REQUIRE(a.size() == b.size());
          REQUIRE_FALSE(a.empty());
          CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

// Greedy, 32 tokens, no stop at end-of-generation (as the references were made).
std::vector<test::GenerationRequest> arch_requests(const std::string& name) {
  const Json golden =
      JsonParser(read_text(test::shared_file("golden/archs/" + name + ".json"))).parse();
  std::vector<test::GenerationRequest> all;
  for (const auto& p : golden["prompts"].array) {
    test::GenerationRequest r;
    for (int id : p["prompt_ids"].ints()) r.prompt.push_back(id);
    r.params.temperature = 0.0f;
    r.params.max_tokens = 32;
    r.params.ignore_eos = true;
    all.push_back(r);
  }
  return all;
}

void check_arch(const std::string& name, const std::vector<Cut>& cuts, std::int32_t ranks = 1) {
  check_stages(test::shared_file("models/archs/" + name + ".gguf"), arch_requests(name), {}, cuts,
               ranks);
}

// stories260K's golden requests in 2, 3 and 1 + 4 stages of `ranks` rank(s) each: check_stages'
// bits, and in two stages llama.cpp's greedy outputs.
void check_stories260k(std::int32_t ranks) {
  const auto cases = test::golden_cases();
  std::vector<test::GenerationRequest> requests;
  for (const auto& c : cases.array) requests.push_back(test::golden_request(c));
  const std::string path = test::shared_file("models/stories260K.gguf");
  auto m = test::LoadedTestModel::open(path, 1);
  check_stages(path, requests, m.tokenizer->vocabulary().end_of_generation,
               {{2, {}}, {3, {}}, {2, {1, m.config.num_layers - 1}}}, ranks);
  auto stages = load_stages(path, 2, {}, KvCacheDtype::f16, ranks);
  REQUIRE(stages.has_value());
  auto result =
      test::BatchGenerator(models_of(*stages), m.tokenizer->vocabulary().end_of_generation)
          .run(requests);
  REQUIRE(result.has_value());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& output = (*result)[i].output;
    CHECK(std::vector<int>(output.begin(), output.end()) == cases.array[i]["output_ids"].ints());
  }
}

}  // namespace

TEST_CASE("stories260K in 2 and 3 pipeline stages gives the whole model's tokens and logits",
          "[golden][shared][pp]") {
  check_stories260k(1);
}

TEST_CASE("llama, qwen2 and phi3 in pipeline stages compute what the whole model computes",
          "[golden][shared][pp]") {
  // 4 layers: 2+2, 2+1+1, and 1+3 (the first stage a single layer).
  const std::vector<Cut> cuts = {{2, {}}, {3, {}}, {2, {1, 3}}};
  check_arch("llama", cuts);  // separate output.weight, rope_freqs on every stage
  check_arch("qwen2", cuts);  // tied output: the last stage maps token_embd as its head
  check_arch("phi3", cuts);   // fused QKV and gate+up, a window on every layer
}

TEST_CASE(
    "gemma2 and gemma3 in pipeline stages compute what the whole model computes (windows and "
    "RoPE by the file's layer number)",
    "[golden][shared][pp]") {
  // gemma2's 26 layers: 9+9+8 (stage 1 starts on an odd, windowless layer); gemma3's 12:
  // 5+7 (its local:global period of 6 cut off its beat).
  check_arch("gemma2", {{2, {}}, {3, {}}});
  check_arch("gemma3", {{2, {}}, {3, {}}, {2, {5, 7}}});
}

TEST_CASE("qwen3 and mixtral in pipeline stages compute what the whole model computes",
          "[golden][shared][pp][moe]") {
  check_arch("qwen3", {{2, {}}, {3, {}}});
  check_arch("mixtral", {{2, {}}, {4, {}}});
}

TEST_CASE("a pipeline that cannot cut the model is refused, saying why", "[golden][shared][pp]") {
  const std::string path = test::shared_file("models/archs/llama.gguf");  // 4 layers
  const auto refused = [&](std::int32_t stages, const std::vector<std::int32_t>& partition) {
    auto loaded = load_stages(path, stages, partition, KvCacheDtype::f32);
    REQUIRE_FALSE(loaded.has_value());
    return loaded.error().message;
  };
  CHECK_THAT(refused(5, {}), Catch::Contains("4 layers cannot be cut into 5 stages"));
  CHECK_THAT(refused(2, {2, 3}), Catch::Contains("adds up to 5 layers, the model has 4"));
  CHECK_THAT(refused(2, {1, 1, 2}), Catch::Contains("partition has 3 stages, the pipeline 2"));
  CHECK_THAT(refused(2, {0, 4}), Catch::Contains("at least one layer"));
  // A stage without its pipeline cannot run.
  engine::WorkerSpec spec;
  spec.model_path = path;
  spec.pipeline_size = 2;
  auto alone = worker::open_model(spec);
  REQUIRE_FALSE(alone.has_value());
  CHECK_THAT(alone.error().message, Catch::Contains("no pipeline to join"));
}

TEST_CASE(
    "stages that are tensor-parallel groups compute what the split model computes, and "
    "stories260K gives llama.cpp's greedy outputs",
    "[golden][shared][pp][tp]") {
  // Rank r of each stage passes the (whole) hidden states to rank r of the next; the last
  // stage's rank 0 gathers the vocabulary-split logits.
  // Three stages: a middle stage that is a group (its ranks receive and send on).
  check_stories260k(2);
  check_arch("llama", {{2, {}}, {2, {1, 3}}}, 2);  // a separate head, split by vocabulary
  check_arch("qwen2", {{2, {}}}, 2);               // tied: the last stage's ranks cut token_embd
}
