// troupe computes what llama.cpp computes for each architecture it reads (llama, llama
// with F16 weights, qwen2, phi3, gemma2): random-weight models and llama.cpp's greedy
// ids and first-step logits, from ../shared/golden/archs (see its README for the
// tolerances used here).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "golden/golden_support.hpp"

using namespace troupe;

namespace {

using test::Json;
using test::JsonParser;
using test::read_text;

Json arch_golden(const std::string& name) {
  return JsonParser(read_text(test::shared_file("golden/archs/" + name + ".json"))).parse();
}

// Greedy, 32 tokens, no stop at end-of-generation: how the references were made.
worker::GenerationRequest arch_request(const Json& prompt) {
  worker::GenerationRequest r;
  for (int id : prompt["prompt_ids"].ints()) r.prompt.push_back(id);
  r.params.temperature = 0.0f;
  r.params.max_tokens = 32;
  r.params.ignore_eos = true;
  return r;
}

// How many leading steps are comparable: up to the first whose top1-top2 margin is
// under 0.02 in llama.cpp (all of them when none is).
std::size_t comparable_steps(const Json& low_margin_step, std::size_t all) {
  return low_margin_step.kind == Json::Kind::null
             ? all
             : static_cast<std::size_t>(low_margin_step.number);
}

std::vector<int> ids_of(const std::vector<TokenId>& ids) {
  return {ids.begin(), ids.end()};
}

std::vector<int> head(const std::vector<int>& ids, std::size_t n) {
  return {ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(n, ids.size()))};
}

std::vector<worker::GenerationRequest> requests_of(const Json& golden) {
  std::vector<worker::GenerationRequest> all;
  for (const auto& p : golden["prompts"].array) all.push_back(arch_request(p));
  return all;
}

// With an F32 KV cache (as the references were recorded): each prompt alone matches
// llama.cpp's ids and first-step logits; all prompts in one batch, and in prefill chunks
// of 5, give bit-identical results to each alone.
void check_f32_cache(const std::string& name) {
  const Json golden = arch_golden(name);
  const double tolerance = golden["tolerance_advice"]["logits_first_rel"].number;
  auto m = test::LoadedTestModel::open(test::shared_file("models/archs/" + name + ".gguf"), 64, 16,
                                       2, model::KvCacheDtype::f32);
  worker::BatchGenerator generator(*m.model, {});
  const auto requests = requests_of(golden);
  std::vector<worker::GenerationResult> alone;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Json& p = golden["prompts"].array[i];
    INFO(name << " prompt " << p["name"].string);
    auto result = generator.run({requests[i]});
    REQUIRE(result.has_value());
    const auto& r = (*result)[0];
    const auto want = p["output_ids"].ints();
    const auto got = ids_of(r.output);
    REQUIRE(got.size() == want.size());
    const std::size_t k = comparable_steps(p["first_low_margin_step"], want.size());
    CHECK(head(got, k) == head(want, k));
    if (k < want.size()) {
      // At the first low-margin step, llama.cpp's top 1 or top 2.
      const auto& top = p["top5_per_step"].array[k].array;
      const int id = got[k];
      CHECK((id == static_cast<int>(top[0]["id"].number) ||
             id == static_cast<int>(top[1]["id"].number)));
    }
    const auto& reference = p["logits_first"].array;
    REQUIRE(r.first_logits.size() == reference.size());
    double max_ref = 0.0, max_diff = 0.0;
    for (std::size_t j = 0; j < reference.size(); ++j) {
      max_ref = std::max(max_ref, std::fabs(reference[j].number));
      max_diff = std::max(max_diff, std::fabs(r.first_logits[j] - reference[j].number));
    }
    INFO("first-step logits differ by up to " << max_diff << " (max |logit| " << max_ref << ")");
    CHECK(max_diff <= tolerance * max_ref);
    alone.push_back(r);
  }
  // Batch invariance: every prompt in one engine step sequence, then in chunks.
  for (const std::int32_t chunk : {0, 5}) {
    INFO(name << ", all prompts together, prefill chunk " << chunk);
    auto together = generator.run(requests, chunk);
    REQUIRE(together.has_value());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      CHECK((*together)[i].output == alone[i].output);
      if (chunk == 0) {
        const auto& a = alone[i].first_logits;
        const auto& b = (*together)[i].first_logits;
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      }
    }
  }
}

// With the default F16 KV cache: the ids equal those of llama.cpp's run with its default
// F16 cache over their comparable prefix (up to its first step of margin < 0.02), each
// prompt alone and all together.
void check_f16_cache(const std::string& name) {
  const Json golden = arch_golden(name);
  auto m = test::LoadedTestModel::open(test::shared_file("models/archs/" + name + ".gguf"), 64);
  REQUIRE(m.kv_dtype == model::KvCacheDtype::f16);
  worker::BatchGenerator generator(*m.model, {});
  const auto requests = requests_of(golden);
  auto together = generator.run(requests);
  REQUIRE(together.has_value());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Json& p = golden["prompts"].array[i];
    INFO(name << " prompt " << p["name"].string << " with an F16 KV cache");
    const auto want = p["kv_f16"]["output_ids"].ints();
    const std::size_t k = comparable_steps(p["kv_f16"]["first_low_margin_step"], want.size());
    auto alone = generator.run({requests[i]});
    REQUIRE(alone.has_value());
    CHECK(head(ids_of((*alone)[0].output), k) == head(want, k));
    CHECK((*together)[i].output == (*alone)[0].output);
  }
}

}  // namespace

TEST_CASE("llama (Llama 3.1 RoPE factors) computes what llama.cpp computes", "[golden][shared]") {
  check_f32_cache("llama");
  check_f16_cache("llama");
}

TEST_CASE("llama with F16 weights computes what llama.cpp computes", "[golden][shared]") {
  check_f32_cache("llama-f16");
  check_f16_cache("llama-f16");
}

TEST_CASE("qwen2 (Q/K/V biases, NEOX RoPE, tied output) computes what llama.cpp computes",
          "[golden][shared]") {
  check_f32_cache("qwen2");
  check_f16_cache("qwen2");
}

TEST_CASE(
    "phi3 (fused QKV and gate-up, sliding window on every layer) computes what llama.cpp "
    "computes",
    "[golden][shared]") {
  check_f32_cache("phi3");
  check_f16_cache("phi3");
}

TEST_CASE(
    "gemma2 (softcaps, post-norms, GELU, alternating windows) computes what llama.cpp "
    "computes",
    "[golden][shared]") {
  check_f32_cache("gemma2");
  check_f16_cache("gemma2");
}
