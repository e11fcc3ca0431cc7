// LoRA adapters on the GPU against the CPU backend: the shared reference adapters (F32)
// and a random F16 one on their base models, in steps that mix two adapters and the base
// model, a prompt step then decodes. The base model's rows of a mixed step equal a step
// without adapters; the adapted rows differ from it (the update is really applied); steps
// with adapters run eagerly, and a later base-only step still records and replays a graph.
// Then a slot emptied and refilled at run time (set_adapter) gives its copies back and
// serves the new adapter.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "cpu/cpu_backend.hpp"
#include "gpu/gpu_test_support.hpp"
#include "gpu/steps.hpp"
#include "model/llama_model.hpp"
#include "model/lora_adapter.hpp"
#include "model/random_model.hpp"
#include "support/rounded_model.hpp"

using namespace troupe;

namespace {

// The rows [first, first + count) of a step's logits, as a span.
std::span<const float> rows_of(const std::vector<float>& logits, std::int32_t vocab,
                               std::int32_t first, std::int32_t count) {
  return {logits.data() + static_cast<std::size_t>(first) * vocab,
          static_cast<std::size_t>(count) * vocab};
}

void compare_with_adapters(const std::string& base_path, const std::string& adapter_one,
                           const std::string& adapter_two, double tolerance) {
  gpu::CudaBackendOptions options;
  options.weight_dtype = gpu::WeightDtype::f16;
  auto gpu_backend = test::gpu_or_skip(options);
  const std::string rounded = test::with_matrices_in(base_path, gguf::TensorType::f16);
  auto file = gguf::GgufFile::open(rounded);
  std::filesystem::remove(rounded);  // the mapping keeps it while the models use it
  REQUIRE(file.has_value());
  cpu::CpuBackend cpu_backend(0);
  auto cpu_model = model::LlamaModel::load(*file, cpu_backend);
  REQUIRE(cpu_model.has_value());
  const auto& c = cpu_model->config();
  options.max_model_len = c.context_length;
  gpu_backend = test::gpu_or_skip(options);
  auto gpu_model = model::LlamaModel::load(*file, *gpu_backend);
  REQUIRE(gpu_model.has_value());
  std::vector<std::shared_ptr<const model::LoraAdapter>> adapters;
  for (const auto& path : {adapter_one, adapter_two}) {
    auto adapter = model::LoraAdapter::open(path, *file, c);
    REQUIRE(adapter.has_value());
    adapters.push_back(std::make_shared<const model::LoraAdapter>(std::move(*adapter)));
    REQUIRE(cpu_model->attach_adapter(adapters.back()).has_value());
    REQUIRE(gpu_model->attach_adapter(adapters.back()).has_value());
  }
  const std::int32_t block_size = 16;
  const model::KvCacheShape shape{c.num_layers, 64, block_size, c.num_kv_heads, c.head_dim};
  REQUIRE(cpu_backend.allocate_kv_cache(shape).has_value());
  REQUIRE(gpu_backend->allocate_kv_cache(shape).has_value());

  // Four sequences: adapter 1, the base model, adapter 2, adapter 1 again.
  const std::vector<std::int32_t> slots = {1, 0, 2, 1};
  std::vector<std::int32_t> lengths = {20, 7, 33, 9};
  std::vector<TokenId> prompt;
  std::uniform_int_distribution<TokenId> token(3, c.vocab_size - 1);
  for (std::int32_t i = 0; i < 20 + 7 + 33 + 9; ++i) prompt.push_back(token(test::rng()));
  auto step = test::make_step(lengths, lengths, block_size, false, prompt);
  step.logit_rows = {19, 26, 59, 68};  // each prompt's last token
  // The base model alone first (the adapters' step then writes the same KV slots again).
  std::vector<float> base_logits, cpu_logits, gpu_logits;
  REQUIRE(gpu_model->forward(step, base_logits).has_value());
  step.adapters = slots;
  REQUIRE(cpu_model->forward(step, cpu_logits).has_value());
  REQUIRE(gpu_model->forward(step, gpu_logits).has_value());
  const std::int32_t vocab = c.vocab_size;
  CHECK(test::relative_error(gpu_logits, cpu_logits) < tolerance);
  // The base model's row is the base step's; every adapted row is not.
  CHECK(test::relative_error(rows_of(gpu_logits, vocab, 1, 1), rows_of(base_logits, vocab, 1, 1)) <
        1e-6);
  // ... by more than three times the two backends' own disagreement on it.
  for (const std::int32_t r : {0, 2, 3}) {
    INFO("row " << r);
    const double noise = std::max(1e-4, test::relative_error(rows_of(gpu_logits, vocab, r, 1),
                                                             rows_of(cpu_logits, vocab, r, 1)));
    CHECK(test::relative_error(rows_of(gpu_logits, vocab, r, 1),
                               rows_of(base_logits, vocab, r, 1)) > 3 * noise);
  }

  // Decode steps with the adapters: eager, each against the CPU.
  std::vector<TokenId> next(4, 5);
  for (int i = 0; i < 4; ++i) {
    for (auto& l : lengths) ++l;
    step = test::make_step(lengths, {1, 1, 1, 1}, block_size, true, next);
    step.adapters = slots;
    REQUIRE(cpu_model->forward(step, cpu_logits).has_value());
    REQUIRE(gpu_model->forward(step, gpu_logits).has_value());
    CHECK(test::relative_error(gpu_logits, cpu_logits) < tolerance);
    for (std::int32_t r = 0; r < 4; ++r) {
      const auto row = rows_of(cpu_logits, vocab, r, 1);
      next[r] = static_cast<TokenId>(std::max_element(row.begin(), row.end()) - row.begin());
    }
  }
  CHECK(gpu_backend->num_graphs() == 0);
  // Base-only decodes still run from a graph: the first eagerly, the second records it.
  for (int i = 0; i < 3; ++i) {
    for (auto& l : lengths) ++l;
    step = test::make_step(lengths, {1, 1, 1, 1}, block_size, true, next);
    REQUIRE(cpu_model->forward(step, cpu_logits).has_value());
    REQUIRE(gpu_model->forward(step, gpu_logits).has_value());
    CHECK(test::relative_error(gpu_logits, cpu_logits) < tolerance);
  }
  CHECK(gpu_backend->num_graphs() == 1);

  // Run-time updating: slot 2 emptied (its device copies given back), then refilled with
  // adapter one; a prompt under slot 2 is then the same prompt under slot 1.
  const std::int64_t held = gpu_backend->bytes_in_use();
  REQUIRE(gpu_model->set_adapter(2, nullptr).has_value());
  CHECK(gpu_backend->bytes_in_use() < held);
  REQUIRE(gpu_model->set_adapter(2, adapters[0]).has_value());
  const std::vector<std::int32_t> twins = {20, 20};
  std::vector<TokenId> twice(prompt.begin(), prompt.begin() + 20);
  twice.insert(twice.end(), prompt.begin(), prompt.begin() + 20);
  step = test::make_step(twins, twins, block_size, false, twice);
  step.logit_rows = {19, 39};
  step.adapters = {1, 2};
  REQUIRE(gpu_model->forward(step, gpu_logits).has_value());
  CHECK(test::relative_error(rows_of(gpu_logits, vocab, 1, 1), rows_of(gpu_logits, vocab, 0, 1)) <
        1e-6);
}

}  // namespace

TEST_CASE("LoRA adapters on the GPU match the CPU in steps that mix them with the base model",
          "[gpu][lora][shared]") {
  SECTION("llama with its F32 reference adapters: attention only at rank 8, all at rank 16") {
    compare_with_adapters(test::shared_file("models/archs/llama.gguf"),
                          test::shared_file("models/lora/llama-attn-r8.gguf"),
                          test::shared_file("models/lora/llama-all-r16.gguf"), 1e-2);
  }
  SECTION("qwen2 with its F32 reference adapter and a random F16 one of rank 32") {
    const auto base = test::shared_file("models/archs/qwen2.gguf");
    (void)test::gpu_or_skip();
    model::RandomAdapterSpec spec;
    spec.base_path = base;
    spec.rank = 32;
    spec.type = gguf::TensorType::f16;
    spec.seed = test::rng()();
    spec.stddev = 0.05f;
    const auto f16_adapter = test::temp_path("gpu-lora-f16.gguf");
    REQUIRE(model::write_random_adapter(spec, f16_adapter).has_value());
    compare_with_adapters(base, test::shared_file("models/lora/qwen2-qv-r4.gguf"), f16_adapter,
                          1e-2);
    std::filesystem::remove(f16_adapter);
  }
}
