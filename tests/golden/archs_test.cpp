// troupe computes what llama.cpp computes for each architecture it reads (llama, llama
// with F16 weights, qwen2, phi3, gemma2; qwen3 and gemma3 against ik_llama.cpp):
// random-weight models and the references' greedy ids and first-step logits, from
// ../shared/golden/archs (see its README for the tolerances used here); batched and
// chunked runs give the same ids as single ones, and a model split over ranks computes
// what the whole one does.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <optional>

#include "gguf/dequantize.hpp"
#include "gguf/gguf_writer.hpp"
#include "golden/golden_support.hpp"
#include "model/rendezvous_stores.hpp"
#include "worker/backend_factory.hpp"

using namespace troupe;

namespace {

using test::Json;
using test::JsonParser;
using test::read_text;

Json arch_golden(const std::string& name) {
  return JsonParser(read_text(test::shared_file("golden/archs/" + name + ".json"))).parse();
}

// Greedy, 32 tokens, no stop at end-of-generation: how the references were made.
test::GenerationRequest arch_request(const Json& prompt) {
  test::GenerationRequest r;
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

// A prompt's first-step logits against its reference's, within `tolerance` of the largest.
void check_first_logits(const std::vector<float>& got, const Json& prompt, double tolerance) {
  const auto& reference = prompt["logits_first"].array;
  REQUIRE(got.size() == reference.size());
  double max_ref = 0.0, max_diff = 0.0;
  for (std::size_t j = 0; j < reference.size(); ++j) {
    max_ref = std::max(max_ref, std::fabs(reference[j].number));
    max_diff = std::max(max_diff, std::fabs(got[j] - reference[j].number));
  }
  INFO("first-step logits differ by up to " << max_diff << " (max |logit| " << max_ref << ")");
  CHECK(max_diff <= tolerance * max_ref);
}

std::vector<test::GenerationRequest> requests_of(const Json& golden) {
  std::vector<test::GenerationRequest> all;
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
                                       2, KvCacheDtype::f32);
  test::BatchGenerator generator(*m.model, {});
  const auto requests = requests_of(golden);
  std::vector<test::GenerationResult> alone;
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
    check_first_logits(r.first_logits, p, tolerance);
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
  REQUIRE(m.kv_dtype == KvCacheDtype::f16);
  test::BatchGenerator generator(*m.model, {});
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

// The ik_llama.cpp references (qwen3, qwen3moe, gemma3, gpt-oss) were recorded with an F16
// KV cache (its CPU backend has no other). With ours in F16 too, each prompt alone gives
// `output_ids` over its comparable prefix (then its top 1 or 2); with an F32 cache, the
// independent float64 pass's exact ids over theirs (the F16 rounding alone moves some
// early). Either way the first-step logits are within the advised tolerance, and every
// prompt batched, and in prefill chunks of 5, gives what it gives alone.
void check_ik_reference(const std::string& name) {
  const Json golden = arch_golden(name);
  const double tolerance = golden["tolerance_advice"]["logits_first_rel"].number;
  const auto requests = requests_of(golden);
  for (const auto kv_dtype : {KvCacheDtype::f16, KvCacheDtype::f32}) {
    const bool f16 = kv_dtype == KvCacheDtype::f16;
    auto m = test::LoadedTestModel::open(test::shared_file("models/archs/" + name + ".gguf"), 64,
                                         16, 2, kv_dtype);
    test::BatchGenerator generator(*m.model, {});
    std::vector<test::GenerationResult> alone;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const Json& p = golden["prompts"].array[i];
      const Json& exact = p["float64_cross_check"]["exact"];
      INFO(name << " prompt " << p["name"].string << (f16 ? ", F16" : ", F32") << " KV cache");
      auto result = generator.run({requests[i]});
      REQUIRE(result.has_value());
      const auto& r = (*result)[0];
      const auto want = f16 ? p["output_ids"].ints() : exact["output_ids"].ints();
      const auto got = ids_of(r.output);
      REQUIRE(got.size() == want.size());
      const std::size_t k = comparable_steps(
          f16 ? p["first_low_margin_step"] : exact["first_low_margin_step"], want.size());
      CHECK(head(got, k) == head(want, k));
      if (f16 && k < want.size()) {
        const auto& top = p["top5_per_step"].array[k].array;
        CHECK((got[k] == static_cast<int>(top[0]["id"].number) ||
               got[k] == static_cast<int>(top[1]["id"].number)));
      }
      check_first_logits(r.first_logits, p, tolerance);
      alone.push_back(r);
    }
    for (const std::int32_t chunk : {0, 5}) {
      INFO(name << ", all prompts together, prefill chunk " << chunk);
      auto together = generator.run(requests, chunk);
      REQUIRE(together.has_value());
      for (std::size_t i = 0; i < requests.size(); ++i) {
        CHECK((*together)[i].output == alone[i].output);
      }
    }
  }
}

// The ranks of a tensor-parallel group (threads of this process, Gloo on loopback), each
// with a default (F16) KV cache.
std::vector<model::LoadedModel> load_group(const std::string& path, std::int32_t size,
                                           KvCacheDtype kv_dtype) {
  model::InProcessStore store;
  static int formation = 0;
  worker::GroupLink link;
  link.store = &store;
  link.prefix = "archs-tp-" + std::to_string(++formation);
  link.timeout = std::chrono::seconds(20);
  std::vector<std::future<Result<model::LoadedModel>>> loading;
  for (std::int32_t r = 0; r < size; ++r) {
    loading.push_back(std::async(std::launch::async, [&, r]() -> Result<model::LoadedModel> {
      engine::WorkerSpec spec;
      spec.model_path = path;
      spec.num_threads = 1;
      spec.rank = r;
      spec.world_size = size;
      TROUPE_TRY(auto m, worker::open_model(spec, &link));
      m.kv_dtype = kv_dtype;
      TROUPE_TRY_VOID(m.allocate_kv_cache(64, 16));
      return m;
    }));
  }
  std::vector<model::LoadedModel> ranks;
  std::optional<Error> failed;
  for (auto& rank : loading) {
    auto m = rank.get();
    if (!m && !failed) failed = m.error();
    if (m) ranks.push_back(std::move(*m));
  }
  if (failed) FAIL("a rank failed to load: " << failed->message);
  return ranks;
}

// Split over 2 and 4 ranks (4: each KV head held by two ranks), the model gives the whole
// model's ids, and its first-step logits within a tolerance of max |logit| (only the
// order of the all-reduced sums differs).
void check_split(const std::string& name, KvCacheDtype kv_dtype) {
  const Json golden = arch_golden(name);
  const std::string path = test::shared_file("models/archs/" + name + ".gguf");
  const auto requests = requests_of(golden);
  auto whole = test::LoadedTestModel::open(path, 64, 16, 2, kv_dtype);
  auto expected = test::BatchGenerator(*whole.model, {}).run(requests);
  REQUIRE(expected.has_value());
  // The split reorders the all-reduced sums (~1e-7 each). With an F16 cache that can move
  // a key or value to the neighbouring half (2^-11 relative), which gemma2's 26 layers
  // carry to ~6e-4 of the logits.
  const double tolerance = kv_dtype == KvCacheDtype::f32 ? 1e-4 : 1e-3;
  for (const std::int32_t size : {2, 4}) {
    INFO(name << " split over " << size << " ranks");
    auto ranks = load_group(path, size, kv_dtype);
    std::vector<model::LlamaModel*> models;
    for (auto& r : ranks) models.push_back(r.model.get());
    auto result = test::BatchGenerator(models, {}).run(requests);
    REQUIRE(result.has_value());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      CHECK((*result)[i].output == (*expected)[i].output);
      const auto& a = (*result)[i].first_logits;
      const auto& b = (*expected)[i].first_logits;
      REQUIRE(a.size() == b.size());
      double max_ref = 0.0, max_diff = 0.0;
      for (std::size_t j = 0; j < a.size(); ++j) {
        max_ref = std::max(max_ref, static_cast<double>(std::fabs(b[j])));
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[j] - b[j])));
      }
      CHECK(max_diff <= tolerance * max_ref);
    }
  }
}

// The error of loading reference model `name` with tensor `tensor` dropped (rows 0) or cut
// to its first `rows` rows.
std::string load_error_without(const std::string& name, const std::string& tensor,
                               std::int64_t rows = 0) {
  auto file = gguf::GgufFile::open(test::shared_file("models/archs/" + name + ".gguf"));
  REQUIRE(file.has_value());
  gguf::GgufWriter writer;
  for (const auto& [key, value] : file->metadata()) writer.add_value(key, value);
  for (const auto& t : file->tensors()) {
    std::vector<std::int64_t> dims(t.dims, t.dims + t.num_dims);
    std::size_t bytes = t.num_bytes;
    if (t.name == tensor) {
      if (rows == 0) continue;
      dims[1] = rows;
      bytes = gguf::row_bytes(t.type, t.dims[0]) * static_cast<std::size_t>(rows);
    }
    writer.add_tensor(t.name, t.type, dims, std::vector<std::byte>(t.data, t.data + bytes));
  }
  const auto bytes = writer.to_bytes();
  auto broken = gguf::GgufFile::parse(bytes);
  REQUIRE(broken.has_value());
  cpu::CpuBackend backend(1);
  auto model = model::LlamaModel::load(*broken, backend);
  REQUIRE_FALSE(model.has_value());
  return model.error().message;
}

}  // namespace

TEST_CASE("a reference model missing a tensor of its architecture fails to load, naming it",
          "[golden][shared]") {
  CHECK_THAT(load_error_without("qwen2", "blk.2.attn_v.bias"),
             Catch::Contains("'blk.2.attn_v.bias'"));
  CHECK_THAT(load_error_without("phi3", "blk.1.attn_qkv.weight", 192),
             Catch::Contains("'blk.1.attn_qkv.weight' has shape [128, 192]"));
  CHECK_THAT(load_error_without("phi3", "blk.0.ffn_up.weight", 352),
             Catch::Contains("'blk.0.ffn_up.weight'"));
  CHECK_THAT(load_error_without("gemma2", "blk.3.post_ffw_norm.weight"),
             Catch::Contains("'blk.3.post_ffw_norm.weight'"));
  CHECK_THAT(load_error_without("qwen3", "blk.0.attn_k_norm.weight"),
             Catch::Contains("'blk.0.attn_k_norm.weight'"));
  CHECK_THAT(load_error_without("qwen3moe", "blk.1.ffn_down_exps.weight"),
             Catch::Contains("'blk.1.ffn_down_exps.weight'"));
  CHECK_THAT(load_error_without("gpt-oss", "blk.2.attn_sinks.weight"),
             Catch::Contains("'blk.2.attn_sinks.weight'"));
  CHECK_THAT(load_error_without("gpt-oss", "blk.0.ffn_gate_inp.bias"),
             Catch::Contains("'blk.0.ffn_gate_inp.bias'"));
}

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

TEST_CASE("qwen2, phi3 and gemma2 split over ranks compute what the whole model computes",
          "[golden][shared][tp]") {
  // Biases cut with their heads, fused QKV and gate-up cut in each of their parts, and
  // gemma2's head_dim != dim / heads.
  for (const auto kv_dtype : {KvCacheDtype::f32, KvCacheDtype::f16}) {
    INFO((kv_dtype == KvCacheDtype::f32 ? "F32" : "F16") << " KV cache");
    check_split("qwen2", kv_dtype);
    check_split("phi3", kv_dtype);
    check_split("gemma2", kv_dtype);
  }
}

TEST_CASE("qwen3 (per-head Q/K norms, head_dim != dim / heads) computes what ik_llama.cpp computes",
          "[golden][shared]") {
  check_ik_reference("qwen3");
}

TEST_CASE(
    "gemma3 (Q/K norms, five local layers to one global, each with its own RoPE) computes what "
    "ik_llama.cpp computes",
    "[golden][shared]") {
  check_ik_reference("gemma3");
}

TEST_CASE("qwen3 and gemma3 split over ranks compute what the whole model computes",
          "[golden][shared][tp]") {
  for (const auto kv_dtype : {KvCacheDtype::f32, KvCacheDtype::f16}) {
    INFO((kv_dtype == KvCacheDtype::f32 ? "F32" : "F16") << " KV cache");
    check_split("qwen3", kv_dtype);
    check_split("gemma3", kv_dtype);
  }
}

TEST_CASE("mixtral (llama with 8 experts, 2 per token) computes what llama.cpp computes",
          "[golden][shared][moe]") {
  check_f32_cache("mixtral");
  check_f16_cache("mixtral");
}

TEST_CASE(
    "qwen3moe (16 experts, 4 per token, renormalised, Q/K norms) computes what ik_llama.cpp "
    "computes",
    "[golden][shared][moe]") {
  check_ik_reference("qwen3moe");
}

TEST_CASE("mixtral and qwen3moe split over ranks compute what the whole model computes",
          "[golden][shared][tp][moe]") {
  // Each rank holds its slice of every expert: one all-reduce after the layer.
  for (const auto kv_dtype : {KvCacheDtype::f32, KvCacheDtype::f16}) {
    INFO((kv_dtype == KvCacheDtype::f32 ? "F32" : "F16") << " KV cache");
    check_split("mixtral", kv_dtype);
    check_split("qwen3moe", kv_dtype);
  }
}

TEST_CASE(
    "gpt-oss (attention sinks, biases, YaRN, even-layer windows, 8 experts with a biased "
    "router and a clamped SwiGLU) computes what ik_llama.cpp computes",
    "[golden][shared][moe]") {
  check_ik_reference("gpt-oss");
}

TEST_CASE("gpt-oss split over ranks computes what the whole model computes",
          "[golden][shared][tp][moe]") {
  // Sinks cut with their heads; the experts' down bias added by rank 0 alone.
  for (const auto kv_dtype : {KvCacheDtype::f32, KvCacheDtype::f16}) {
    INFO((kv_dtype == KvCacheDtype::f32 ? "F32" : "F16") << " KV cache");
    check_split("gpt-oss", kv_dtype);
  }
}

TEST_CASE(
    "a model whose weights exceed the memory is refused before they are touched, saying "
    "how much of it is experts",
    "[golden][shared][moe]") {
  auto opened = model::LoadedModel::open(test::shared_file("models/archs/qwen3moe.gguf"));
  REQUIRE(opened.has_value());
  const auto& file = *opened->file;
  const auto& config = opened->config;
  CHECK(model::check_weights_fit(file, config, 1, std::int64_t{1} << 40).has_value());
  const auto refused = model::check_weights_fit(file, config, 1, 4 << 20);
  REQUIRE_FALSE(refused.has_value());
  CHECK_THAT(refused.error().message,
             Catch::Contains("7.8 MiB") && Catch::Contains("4.0 MiB of memory") &&
                 Catch::Contains("16 experts a layer hold") && Catch::Contains("Q3_K_M"));
  // Split over 2 ranks, each maps half: it fits where the whole would not.
  CHECK(model::check_weights_fit(file, config, 2, 5 << 20).has_value());
  // Beside another model's weights (a draft beside its target) the two must fit together.
  CHECK(model::check_weights_fit(file, config, 1, 9 << 20).has_value());
  const auto together = model::check_weights_fit(file, config, 1, 9 << 20, 2 << 20);
  REQUIRE_FALSE(together.has_value());
  CHECK_THAT(together.error().message,
             Catch::Contains("7.8 MiB") &&
                 Catch::Contains("with the 2.0 MiB of the model beside") &&
                 Catch::Contains("9.0 MiB of memory"));
  CHECK(model::tensor_bytes(file) > 7 << 20);
}
