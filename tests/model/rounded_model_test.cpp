// The GPU tests' CPU reference: a model whose F32 matrices are rounded to BF16 (or F16)
// loads and runs on the CPU, every matrix now in 16 bits, its outputs near the F32 ones.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "cpu/cpu_backend.hpp"
#include "model/llama_model.hpp"
#include "support/rounded_model.hpp"

using namespace troupe;

TEST_CASE("a model rounded to 16 bits runs on the CPU with its matrices in 16 bits",
          "[model][shared]") {
  const auto path = test::shared_file("models/stories260K.gguf");
  for (const auto type : {gguf::TensorType::bf16, gguf::TensorType::f16}) {
    INFO(gguf::tensor_type_name(type));
    const auto rounded = test::with_matrices_in(path, type);
    auto whole = gguf::GgufFile::open(path);
    auto copy = gguf::GgufFile::open(rounded);
    std::filesystem::remove(rounded);
    REQUIRE(whole.has_value());
    REQUIRE(copy.has_value());
    REQUIRE(copy->tensors().size() == whole->tensors().size());
    for (const auto& t : copy->tensors()) {
      const bool matrix = t.dims[1] * t.dims[2] * t.dims[3] > 1;
      CHECK((t.type == (matrix ? type : gguf::TensorType::f32)));
    }
    cpu::CpuBackend a(1), b(1);
    auto exact = model::LlamaModel::load(*whole, a);
    auto near = model::LlamaModel::load(*copy, b);
    REQUIRE(exact.has_value());
    REQUIRE(near.has_value());
    const auto& c = exact->config();
    const model::KvCacheShape shape{c.num_layers, 4, 16, c.num_kv_heads, c.head_dim};
    REQUIRE(a.allocate_kv_cache(shape).has_value());
    REQUIRE(b.allocate_kv_cache(shape).has_value());
    model::StepInput step;
    const std::vector<TokenId> prompt = {1, 400, 401, 402, 403};
    const std::vector<std::int32_t> table = {0};
    model::append_sequence(step, prompt, 0, table, true);
    std::vector<float> want, got;
    REQUIRE(exact->forward(step, want).has_value());
    REQUIRE(near->forward(step, got).has_value());
    REQUIRE(got.size() == want.size());
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      diff += (got[i] - want[i]) * (got[i] - want[i]);
      norm += want[i] * want[i];
    }
    CHECK(diff > 0.0);  // the weights did change
    CHECK(std::sqrt(diff / norm) < 5e-2);
  }
}
