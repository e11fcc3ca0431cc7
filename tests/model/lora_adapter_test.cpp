// LoRA adapters in llama.cpp's GGUF layout: the shared random adapters read against their
// base models, and broken adapters (written with gguf/'s writer) refused with an error that
// names what is wrong, never a crash.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "cpu/cpu_backend.hpp"
#include "gguf/gguf_writer.hpp"
#include "gguf/half.hpp"
#include "model/llama_model.hpp"
#include "model/lora_adapter.hpp"
#include "model/step_input.hpp"
#include "support/test_support.hpp"

using namespace troupe;
using namespace troupe::model;

namespace {

struct Base {
  gguf::GgufFile file;
  LlamaConfig config;
};

Base open_base(const std::string& name) {
  auto file = gguf::GgufFile::open(test::shared_file("models/archs/" + name + ".gguf"));
  REQUIRE(file.has_value());
  auto config = LlamaConfig::from_gguf(*file);
  REQUIRE(config.has_value());
  return Base{std::move(*file), std::move(*config)};
}

std::vector<std::byte> f32_bytes(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<std::byte> f16_bytes(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * 2);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint16_t h = gguf::f32_to_f16(v[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

std::vector<float> ramp(std::size_t n, float step) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = step * static_cast<float>(i % 17) - 0.25f;
  return v;
}

// A small adapter for archs/llama.gguf (n_embd 128): layer 1's attn_q at rank 4, in F16.
struct AdapterSpec {
  std::string general_type = "adapter";
  std::string adapter_type = "lora";
  std::string architecture = "llama";
  std::optional<float> alpha = 8.0f;
  std::string name = "blk.1.attn_q.weight";
  std::int64_t n_in = 128, n_out = 128, rank = 4;
  std::int64_t b_rank = -1;  // lora_b's rank when it differs
  gguf::TensorType type = gguf::TensorType::f16;
  bool with_b = true;
};

std::vector<std::byte> write_adapter(const AdapterSpec& s) {
  gguf::GgufWriter w;
  w.add_string("general.architecture", s.architecture);
  w.add_string("general.type", s.general_type);
  w.add_string("adapter.type", s.adapter_type);
  if (s.alpha) w.add_float32("adapter.lora.alpha", *s.alpha);
  const auto a = ramp(static_cast<std::size_t>(s.n_in * s.rank), 0.01f);
  const std::int64_t b_rank = s.b_rank < 0 ? s.rank : s.b_rank;
  const auto b = ramp(static_cast<std::size_t>(b_rank * s.n_out), 0.02f);
  const auto encode = [&](const std::vector<float>& v) {
    if (s.type == gguf::TensorType::f16) return f16_bytes(v);
    if (s.type == gguf::TensorType::f32) return f32_bytes(v);
    // Q8_0: 34 bytes a block of 32 (contents need not be meaningful to be refused).
    return std::vector<std::byte>(v.size() / 32 * 34);
  };
  w.add_tensor(s.name + ".lora_a", s.type, {s.n_in, s.rank}, encode(a));
  if (s.with_b) w.add_tensor(s.name + ".lora_b", s.type, {b_rank, s.n_out}, encode(b));
  return w.to_bytes();
}

Result<LoraAdapter> read_adapter(const std::vector<std::byte>& bytes, const Base& base,
                                 float scale = 1.0f) {
  auto file = gguf::GgufFile::parse(bytes);
  if (!file) return make_error(file.error().code, file.error().message);
  return LoraAdapter::read(*file, base.file, base.config, scale);
}

std::string error_of(const Result<LoraAdapter>& r) {
  REQUIRE_FALSE(r.has_value());
  return r.error().message;
}

bool contains(const std::string& text, const std::string& part) {
  INFO(text);
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("the shared LoRA adapters read against their base models", "[lora][shared]") {
  const Base llama = open_base("llama");
  const Base qwen2 = open_base("qwen2");
  const auto dir = std::string("models/lora/");
  SECTION("llama-attn-r8: rank 8, alpha 16, the four attention matrices of every layer") {
    auto a =
        LoraAdapter::open(test::shared_file(dir + "llama-attn-r8.gguf"), llama.file, llama.config);
    REQUIRE(a.has_value());
    CHECK(a->architecture() == "llama");
    CHECK(a->alpha() == 16.0f);
    CHECK(a->num_matrices() == 16);
    CHECK(a->max_rank() == 8);
    const LoraMatrix* q = a->find(3, LoraTarget::attn_q);
    REQUIRE(q != nullptr);
    CHECK(q->scale == 2.0f);
    CHECK(q->n_in == 128);
    CHECK(q->n_out == 128);
    CHECK(q->a.size() == 8 * 128 * (q->type == gguf::TensorType::f16 ? 2 : 4));
    const LoraMatrix* k = a->find(0, LoraTarget::attn_k);
    REQUIRE(k != nullptr);
    CHECK(k->n_out == 64);  // 2 KV heads of 32
    CHECK(a->find(0, LoraTarget::ffn_up) == nullptr);
  }
  SECTION("llama-all-r16: rank 16, alpha 16, seven matrices a layer") {
    auto a = LoraAdapter::open(test::shared_file(dir + "llama-all-r16.gguf"), llama.file,
                               llama.config, 0.5f);
    REQUIRE(a.has_value());
    CHECK(a->num_matrices() == 28);
    const LoraMatrix* down = a->find(2, LoraTarget::ffn_down);
    REQUIRE(down != nullptr);
    CHECK(down->n_in == 352);
    CHECK(down->n_out == 128);
    CHECK(down->scale == 0.5f);  // scale 0.5 * alpha 16 / rank 16
  }
  SECTION("qwen2-qv-r4 on qwen2, and refused on llama, naming both architectures") {
    auto a =
        LoraAdapter::open(test::shared_file(dir + "qwen2-qv-r4.gguf"), qwen2.file, qwen2.config);
    REQUIRE(a.has_value());
    CHECK(a->num_matrices() == 8);
    CHECK(a->find(1, LoraTarget::attn_v)->scale == 2.0f);
    CHECK(a->find(1, LoraTarget::attn_k) == nullptr);
    auto wrong =
        LoraAdapter::open(test::shared_file(dir + "qwen2-qv-r4.gguf"), llama.file, llama.config);
    REQUIRE_FALSE(wrong.has_value());
    CHECK(contains(wrong.error().message, "architecture qwen2"));
    CHECK(contains(wrong.error().message, "base model is llama"));
  }
}

TEST_CASE("a written adapter reads back, F16 kept as F16, with s = scale * alpha / rank",
          "[lora][shared]") {
  const Base llama = open_base("llama");
  AdapterSpec spec;
  auto a = read_adapter(write_adapter(spec), llama, 1.5f);
  REQUIRE(a.has_value());
  const LoraMatrix* m = a->find(1, LoraTarget::attn_q);
  REQUIRE(m != nullptr);
  CHECK(m->rank == 4);
  CHECK(m->scale == 1.5f * 8.0f / 4.0f);
  CHECK(m->type == gguf::TensorType::f16);
  CHECK(m->a.size() == 4 * 128 * 2);
  const auto want_a = ramp(128 * 4, 0.01f);  // A [4][128]
  const auto want_b = ramp(4 * 128, 0.02f);  // B [128][4] as written, kept as B^T [4][128]
  const auto f16 = [](float v) { return gguf::f16_to_f32(gguf::f32_to_f16(v)); };
  for (std::int64_t k = 0; k < 4; ++k) {
    for (std::int64_t i = 0; i < 128; ++i) {
      REQUIRE(m->a_at(k, i) == f16(want_a[static_cast<std::size_t>(k * 128 + i)]));
      REQUIRE(m->b_at(i, k) == f16(want_b[static_cast<std::size_t>(i * 4 + k)]));
    }
  }
  spec.alpha.reset();  // no alpha: s = scale, as llama.cpp
  spec.type = gguf::TensorType::f32;
  auto b = read_adapter(write_adapter(spec), llama, 1.5f);
  REQUIRE(b.has_value());
  CHECK(b->find(1, LoraTarget::attn_q)->scale == 1.5f);
  const LoraMatrix* f32 = b->find(1, LoraTarget::attn_q);
  CHECK(f32->type == gguf::TensorType::f32);
  for (std::int64_t j = 0; j < 128; ++j) {
    for (std::int64_t k = 0; k < 4; ++k) {
      REQUIRE(f32->b_at(j, k) == want_b[static_cast<std::size_t>(j * 4 + k)]);
      REQUIRE(f32->a_at(k, j) == want_a[static_cast<std::size_t>(k * 128 + j)]);
    }
  }
}

TEST_CASE("a broken or mismatched adapter is an error that names what is wrong", "[lora][shared]") {
  const Base llama = open_base("llama");
  AdapterSpec spec;
  SECTION("not an adapter") {
    spec.general_type = "model";
    CHECK(contains(error_of(read_adapter(write_adapter(spec), llama)), "general.type"));
  }
  SECTION("not LoRA") {
    spec.adapter_type = "control_vector";
    CHECK(contains(error_of(read_adapter(write_adapter(spec), llama)), "adapter.type"));
  }
  SECTION("lora_a of the wrong input width") {
    spec.n_in = 64;
    const auto e = error_of(read_adapter(write_adapter(spec), llama));
    CHECK(contains(e, "blk.1.attn_q.weight.lora_a [64, 4]"));
    CHECK(contains(e, "[128, 128]"));
  }
  SECTION("lora_b of the wrong output width: attn_k has 64 outputs") {
    spec.name = "blk.0.attn_k.weight";
    CHECK(contains(error_of(read_adapter(write_adapter(spec), llama)), "blk.0.attn_k.weight"));
  }
  SECTION("ranks of A and B disagree") {
    spec.b_rank = 5;
    CHECK(contains(error_of(read_adapter(write_adapter(spec), llama)), "lora_b [5, 128]"));
  }
  SECTION("a layer past the base's four") {
    spec.name = "blk.4.attn_q.weight";
    const auto e = error_of(read_adapter(write_adapter(spec), llama));
    CHECK(contains(e, "blk.4.attn_q.weight.lora_a"));
    CHECK(contains(e, "has 4"));
  }
  SECTION("a matrix troupe does not adapt") {
    spec.name = "blk.0.attn_qkv.weight";
    CHECK(contains(error_of(read_adapter(write_adapter(spec), llama)), "attn_qkv"));
  }
  SECTION("a tensor that is no LoRA tensor") {
    spec.name = "token_embd.weight";
    CHECK(contains(error_of(read_adapter(write_adapter(spec), llama)),
                   "token_embd.weight.lora_a is not a LoRA tensor"));
  }
  SECTION("lora_a without lora_b") {
    spec.with_b = false;
    CHECK(contains(error_of(read_adapter(write_adapter(spec), llama)), "has no .lora_b"));
  }
  SECTION("a quantized adapter tensor") {
    spec.n_in = 128;
    spec.rank = 32;
    spec.type = gguf::TensorType::q8_0;
    CHECK(contains(error_of(read_adapter(write_adapter(spec), llama)), "only F32 and F16"));
  }
  SECTION("every truncation of a good file is an error, never a crash") {
    const auto bytes = write_adapter(spec);
    for (std::size_t cut = 0; cut < bytes.size(); cut += 7) {
      const std::vector<std::byte> part(bytes.begin(),
                                        bytes.begin() + static_cast<std::ptrdiff_t>(cut));
      CHECK_FALSE(read_adapter(part, llama).has_value());
    }
  }
  SECTION("a file that does not exist") {
    auto a = LoraAdapter::open("/nonexistent/adapter.gguf", llama.file, llama.config);
    REQUIRE_FALSE(a.has_value());
    CHECK(contains(a.error().message, "/nonexistent/adapter.gguf"));
  }
}

TEST_CASE("an adapter attaches to a slot of a CPU model", "[lora][shared]") {
  const Base llama = open_base("llama");
  cpu::CpuBackend backend(1);
  auto model = LlamaModel::load(llama.file, backend);
  REQUIRE(model.has_value());
  auto adapter = LoraAdapter::open(test::shared_file("models/lora/llama-attn-r8.gguf"), llama.file,
                                   llama.config);
  REQUIRE(adapter.has_value());
  auto shared = std::make_shared<const LoraAdapter>(std::move(*adapter));
  CHECK(model->attach_adapter(shared).value() == 1);
  CHECK(model->attach_adapter(shared).value() == 2);
  CHECK(model->num_adapters() == 2);
  CHECK_FALSE(model->attach_adapter(nullptr).has_value());
}

TEST_CASE("an adapter goes into a given slot, replacing or emptying it (run-time loads)",
          "[lora][shared]") {
  const Base llama = open_base("llama");
  cpu::CpuBackend backend(1);
  auto model = LlamaModel::load(llama.file, backend);
  REQUIRE(model.has_value());
  auto adapter = LoraAdapter::open(test::shared_file("models/lora/llama-attn-r8.gguf"), llama.file,
                                   llama.config);
  REQUIRE(adapter.has_value());
  auto shared = std::make_shared<const LoraAdapter>(std::move(*adapter));
  CHECK(model->set_adapter(3, shared).has_value());
  CHECK(model->num_adapters() == 3);  // slots 1 and 2 empty
  CHECK(model->set_adapter(1, shared).has_value());
  CHECK(model->set_adapter(3, nullptr).has_value());
  CHECK(model->num_adapters() == 3);
  CHECK_FALSE(model->set_adapter(0, shared).has_value());  // the base model's
  // Read for another model: refused, and the slot keeps what it held.
  const Base qwen2 = open_base("qwen2");
  auto other = LoraAdapter::open(test::shared_file("models/lora/qwen2-qv-r4.gguf"), qwen2.file,
                                 qwen2.config);
  REQUIRE(other.has_value());
  const auto refused =
      model->set_adapter(1, std::make_shared<const LoraAdapter>(std::move(*other)));
  REQUIRE_FALSE(refused.has_value());
  CHECK(contains(refused.error().message, "read for another model"));
  CHECK(model->attach_adapter(shared).value() == 4);  // attach takes the next slot still
}

TEST_CASE("a step's adapter slots: one per sequence, empty while all run the base model",
          "[lora]") {
  const KvCacheShape cache{1, 8, 4, 1, 2};
  StepInput step;
  const std::vector<TokenId> tokens = {1, 2};
  const std::vector<std::int32_t> table = {0};
  append_sequence(step, tokens, 0, table, true);
  CHECK(step.adapters.empty());
  append_sequence(step, tokens, 0, table, true, 2);
  append_sequence(step, tokens, 0, table, true);
  CHECK(step.adapters == std::vector<std::int32_t>{0, 2, 0});
  CHECK(validate_step(step, cache, 10).has_value());
  step.adapters.pop_back();
  CHECK_FALSE(validate_step(step, cache, 10).has_value());
  step.adapters = {0, -1, 0};
  CHECK_FALSE(validate_step(step, cache, 10).has_value());
}

TEST_CASE("the CPU's lora_add: each group's rows get their own adapter's update, others none",
          "[lora]") {
  cpu::CpuBackend backend(2);
  constexpr std::int64_t n = 11, n_in = 24, n_out = 19;
  std::vector<float> x(n * n_in), y(n * n_out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::cos(0.11f * static_cast<float>(i));
  const std::vector<float> y0 = y;
  struct Adapter {
    std::int64_t rank;
    float scale;
    std::vector<std::int32_t> rows;
    std::vector<float> a, b;      // A [rank][n_in] and B [n_out][rank]
    std::vector<float> b_t = {};  // B^T [rank][n_out], as LoraGroup takes it
  };
  // Group 1 has more rows than one tile of 8; row 5 is in no group (the base model).
  std::vector<Adapter> adapters = {{3, 0.5f, {0, 2, 3, 4, 6, 7, 8, 9, 10}, {}, {}},
                                   {5, 2.0f, {1}, {}, {}}};
  std::vector<LoraGroup> groups;
  for (auto& ad : adapters) {
    ad.a = ramp(static_cast<std::size_t>(ad.rank * n_in), 0.03f);
    ad.b = ramp(static_cast<std::size_t>(n_out * ad.rank), 0.05f);
    ad.b_t.resize(ad.b.size());
    for (std::int64_t k = 0; k < ad.rank; ++k) {
      for (std::int64_t j = 0; j < n_out; ++j) {
        ad.b_t[static_cast<std::size_t>(k * n_out + j)] =
            ad.b[static_cast<std::size_t>(j * ad.rank + k)];
      }
    }
    groups.push_back({Weight{ad.a.data(), gguf::TensorType::f32, ad.rank, n_in},
                      Weight{ad.b_t.data(), gguf::TensorType::f32, ad.rank, n_out}, ad.scale,
                      ad.rows});
  }
  backend.lora_add(Tensor{x.data(), n, n_in}, groups, Tensor{y.data(), n, n_out});
  std::vector<int> group_of(n, -1);
  for (std::size_t g = 0; g < adapters.size(); ++g) {
    for (auto r : adapters[g].rows) group_of[static_cast<std::size_t>(r)] = static_cast<int>(g);
  }
  for (std::int64_t r = 0; r < n; ++r) {
    const int g = group_of[static_cast<std::size_t>(r)];
    for (std::int64_t j = 0; j < n_out; ++j) {
      double want = y0[static_cast<std::size_t>(r * n_out + j)];
      if (g >= 0) {
        const Adapter& ad = adapters[static_cast<std::size_t>(g)];
        double update = 0.0;
        for (std::int64_t k = 0; k < ad.rank; ++k) {
          double ax = 0.0;
          for (std::int64_t i = 0; i < n_in; ++i) {
            ax += static_cast<double>(ad.a[static_cast<std::size_t>(k * n_in + i)]) *
                  x[static_cast<std::size_t>(r * n_in + i)];
          }
          update += static_cast<double>(ad.b[static_cast<std::size_t>(j * ad.rank + k)]) * ax;
        }
        want += ad.scale * update;
      }
      INFO("row " << r << " column " << j);
      if (g < 0) {
        REQUIRE(y[static_cast<std::size_t>(r * n_out + j)] ==
                y0[static_cast<std::size_t>(r * n_out + j)]);
      } else {
        REQUIRE(y[static_cast<std::size_t>(r * n_out + j)] == Approx(want).margin(1e-5));
      }
    }
  }
}

TEST_CASE("the CPU's lora_add gives a row the same bits alone as among others, on every path",
          "[lora]") {
  // Rank 20; 1100 columns: three column blocks of the expansion, full vectors and a scalar
  // tail; 11 rows: tiles of 8 and 3, and of 4, 3, 2 and 1 inside the kernels; F32 and F16.
  const auto type = GENERATE(gguf::TensorType::f32, gguf::TensorType::f16);
  const bool half = type == gguf::TensorType::f16;
  cpu::CpuBackend backend(2);
  constexpr std::int64_t n = 11, n_in = 40, n_out = 1100, rank = 20;
  std::vector<float> x(n * n_in), y0(n * n_out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.29f * static_cast<float>(i));
  for (std::size_t i = 0; i < y0.size(); ++i) y0[i] = std::cos(0.07f * static_cast<float>(i));
  auto a_values = ramp(static_cast<std::size_t>(rank * n_in), 0.03f);  // A [rank][n_in]
  auto b_t = ramp(static_cast<std::size_t>(rank * n_out), 0.05f);      // B^T [rank][n_out]
  if (half) {
    for (auto& v : a_values) v = gguf::f16_to_f32(gguf::f32_to_f16(v));
    for (auto& v : b_t) v = gguf::f16_to_f32(gguf::f32_to_f16(v));
  }
  const auto a_bytes = half ? f16_bytes(a_values) : f32_bytes(a_values);
  const auto b_bytes = half ? f16_bytes(b_t) : f32_bytes(b_t);
  const Weight a{a_bytes.data(), type, rank, n_in};
  const Weight b{b_bytes.data(), type, rank, n_out};
  std::vector<std::int32_t> all(n);
  for (std::int32_t r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
  std::vector<float> together = y0;
  const LoraGroup group{a, b, 0.75f, all};
  backend.lora_add(Tensor{x.data(), n, n_in}, std::span(&group, 1),
                   Tensor{together.data(), n, n_out});
  for (std::int64_t r = 0; r < n; ++r) {
    std::vector<float> alone(y0.begin() + r * n_out, y0.begin() + (r + 1) * n_out);
    const std::vector<std::int32_t> row0 = {0};
    const LoraGroup one{a, b, 0.75f, row0};
    backend.lora_add(Tensor{x.data() + r * n_in, 1, n_in}, std::span(&one, 1),
                     Tensor{alone.data(), 1, n_out});
    for (std::int64_t j = 0; j < n_out; ++j) {
      INFO("row " << r << " column " << j << (half ? " F16" : " F32"));
      REQUIRE(alone[static_cast<std::size_t>(j)] ==
              together[static_cast<std::size_t>(r * n_out + j)]);
      double update = 0.0;
      for (std::int64_t k = 0; k < rank; ++k) {
        double ax = 0.0;
        for (std::int64_t i = 0; i < n_in; ++i) {
          ax += static_cast<double>(a_values[static_cast<std::size_t>(k * n_in + i)]) *
                x[static_cast<std::size_t>(r * n_in + i)];
        }
        update += static_cast<double>(b_t[static_cast<std::size_t>(k * n_out + j)]) * ax;
      }
      REQUIRE(alone[static_cast<std::size_t>(j)] ==
              Approx(y0[static_cast<std::size_t>(r * n_out + j)] + 0.75 * update)
                  .epsilon(1e-4)
                  .margin(1e-4));
    }
  }
}
