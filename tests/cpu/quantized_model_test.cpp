// Random models whose matrices are in the low-bit types (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4,
// llama.cpp's Q3_K_M and Q2_K mixes) run through the CPU backend's int8 kernels and give the
// logits of the same model decoded to F32; a type troupe cannot compute with is refused by
// tensor and type name.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "cpu/cpu_backend.hpp"
#include "gguf/dequantize.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "model/loaded_model.hpp"
#include "model/random_model.hpp"
#include "support/test_support.hpp"

using namespace troupe;
using gguf::TensorType;
using Mix = model::RandomModelSpec::Mix;

namespace {

// A 2-layer GQA model (4 heads, 2 KV heads, 512 tokens) of `dim` and `ffn`, in `type` or `mix`;
// with `experts`, a qwen3moe of that many experts of FFN `ffn`, 3 used a token.
std::string write_model(const std::string& name, TensorType type, Mix mix, std::int32_t dim,
                        std::int32_t ffn, std::int32_t experts = 0) {
  model::RandomModelSpec spec;
  if (experts > 0) {
    spec.arch = "qwen3moe";
    spec.num_experts = experts;
    spec.num_experts_used = 3;
    spec.expert_ffn_dim = ffn;
  }
  spec.dim = dim;
  spec.ffn_dim = ffn;
  spec.num_layers = 2;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.vocab_size = 512;
  spec.stddev = 0.05f;
  spec.type = type;
  spec.mix = mix;
  const std::string path = test::temp_path(name + ".gguf");
  const auto written = model::write_random_model(spec, path);
  REQUIRE(written.has_value());
  return path;
}

// A copy of the file with every quantized tensor decoded to F32 by the scalar decoder.
std::string decoded_to_f32(const std::string& path) {
  auto file = gguf::GgufFile::open(path);
  REQUIRE(file.has_value());
  gguf::GgufWriter writer;
  for (const auto& [key, value] : file->metadata()) writer.add_value(key, value);
  for (const auto& t : file->tensors()) {
    std::vector<std::int64_t> dims(t.dims, t.dims + t.num_dims);
    const std::int64_t cols = t.dims[0], rows = t.num_elements() / cols;
    std::vector<float> values(static_cast<std::size_t>(rows * cols));
    const std::size_t stride = gguf::row_bytes(t.type, cols);
    for (std::int64_t r = 0; r < rows; ++r) {
      REQUIRE(gguf::dequantize_row(t.type, t.data + r * stride, cols, values.data() + r * cols)
                  .has_value());
    }
    writer.add_tensor(t.name, TensorType::f32, dims,
                      *gguf::quantize(TensorType::f32, values, cols));
  }
  const std::string copy = path + ".f32.gguf";
  REQUIRE(writer.write(copy).has_value());
  return copy;
}

// The last logit rows of three prompts (9, 5 and 13 tokens) run as one step.
std::vector<float> prompt_logits(const std::string& path) {
  auto loaded = model::LoadedModel::open(path, std::make_unique<cpu::CpuBackend>(2));
  REQUIRE(loaded.has_value());
  loaded->kv_dtype = KvCacheDtype::f32;
  REQUIRE(loaded->allocate_kv_cache(3, 16).has_value());
  const std::vector<std::vector<TokenId>> prompts = {
      {1, 300, 17, 42, 511, 260, 99, 3, 128},
      {1, 5, 6, 7, 8},
      {1, 400, 401, 12, 13, 14, 200, 201, 202, 9, 10, 11, 290}};
  model::StepInput step;
  for (std::size_t s = 0; s < prompts.size(); ++s) {
    const std::vector<std::int32_t> block_table = {static_cast<std::int32_t>(s)};
    model::append_sequence(step, prompts[s], 0, block_table, /*wants_logits=*/true);
  }
  std::vector<float> logits;
  REQUIRE(loaded->model->forward(step, logits).has_value());
  return logits;
}

}  // namespace

TEST_CASE("a model in each low-bit type gives the logits of its F32 decoding", "[cpu][int8]") {
  struct Case {
    std::string name;
    TensorType type;
    Mix mix;
    std::int32_t dim, ffn;
    std::int32_t experts = 0;
  };
  // Q8_0 and Q4_K are the reference points: the int8 path's known difference from float. The
  // blocks of 32 also at widths of partial chunks (288 = 1.125 chunks, 800 = 3.125).
  for (const Case& c : {Case{"q8_0", TensorType::q8_0, Mix::none, 256, 512},
                        Case{"q4_k", TensorType::q4_k, Mix::none, 256, 512},
                        Case{"q2_k", TensorType::q2_k, Mix::none, 256, 512},
                        Case{"q3_k", TensorType::q3_k, Mix::none, 256, 512},
                        Case{"iq4_xs", TensorType::iq4_xs, Mix::none, 256, 512},
                        Case{"iq4_nl", TensorType::iq4_nl, Mix::none, 288, 800},
                        Case{"mxfp4", TensorType::mxfp4, Mix::none, 288, 800},
                        Case{"q3_k_m", TensorType::f32, Mix::q3_k_m, 256, 512},
                        Case{"q2_k_mix", TensorType::f32, Mix::q2_k, 256, 512},
                        // Experts through the grouped int8 path (qwen3moe, 8 experts, 3 used).
                        Case{"moe-q8_0", TensorType::q8_0, Mix::none, 256, 256, 8},
                        Case{"moe-q4_k_m", TensorType::f32, Mix::q4_k_m, 256, 256, 8},
                        Case{"moe-mxfp4", TensorType::mxfp4, Mix::none, 288, 160, 8}}) {
    INFO(c.name);
    const std::string path =
        write_model("low-bit-" + c.name, c.type, c.mix, c.dim, c.ffn, c.experts);
    const std::string f32 = decoded_to_f32(path);
    const auto got = prompt_logits(path);
    const auto want = prompt_logits(f32);
    REQUIRE(got.size() == want.size());
    // Only the activations differ: the int8 path quantizes them to 8 bits per block of 32
    // (as llama.cpp's CPU backend does), the F32 path keeps them. That moves Q8_0's logits by
    // 1.4-1.5% (root mean square, of the row's), Q4_K's by 1.7-2.1%, the low-bit types' by
    // 1.4-2.2% (this machine, every path). A wrong scale, level or bit order in a kernel moves
    // them by far more.
    const std::size_t vocab = 512;
    for (std::size_t row = 0; row < got.size() / vocab; ++row) {
      double sum_diff2 = 0.0, sum_want2 = 0.0;
      for (std::size_t v = 0; v < vocab; ++v) {
        const double g = got[row * vocab + v], w = want[row * vocab + v];
        REQUIRE(std::isfinite(g));
        sum_diff2 += (g - w) * (g - w);
        sum_want2 += w * w;
      }
      const double relative = std::sqrt(sum_diff2 / sum_want2);
      INFO("row " << row << ": relative difference " << relative);
      REQUIRE(sum_want2 / vocab > 0.25);  // the model is not degenerate
      // With experts, the activations' rounding can also flip a near-tie in a router's top-k
      // (one row of nine here moves by 4.1%); a wrong kernel moves every row by 15% or more.
      CHECK(relative <= (c.experts > 0 ? 0.06 : 0.03));
    }
    std::filesystem::remove(path);
    std::filesystem::remove(f32);
  }
}

TEST_CASE("a model holding a type troupe cannot compute with is refused by tensor and type",
          "[cpu]") {
  // A valid model, then blk.0.ffn_down.weight replaced by IQ2_XXS blocks (a type the GGUF
  // reader knows the size of, but no kernel reads).
  const std::string path = write_model("refused-source", TensorType::q8_0, Mix::none, 256, 512);
  auto file = gguf::GgufFile::open(path);
  REQUIRE(file.has_value());
  gguf::GgufWriter writer;
  for (const auto& [key, value] : file->metadata()) writer.add_value(key, value);
  for (const auto& t : file->tensors()) {
    std::vector<std::int64_t> dims(t.dims, t.dims + t.num_dims);
    if (t.name == "blk.0.ffn_down.weight") {
      writer.add_tensor(t.name, TensorType::iq2_xxs, dims,
                        std::vector<std::byte>(gguf::row_bytes(TensorType::iq2_xxs, t.dims[0]) *
                                               static_cast<std::size_t>(t.dims[1])));
    } else {
      writer.add_tensor(t.name, t.type, dims, std::vector<std::byte>(t.data, t.data + t.num_bytes));
    }
  }
  const std::string refused = test::temp_path("refused-iq2_xxs.gguf");
  REQUIRE(writer.write(refused).has_value());
  auto loaded = model::LoadedModel::open(refused, std::make_unique<cpu::CpuBackend>(1));
  REQUIRE_FALSE(loaded.has_value());
  CHECK(loaded.error().message ==
        "tensor 'blk.0.ffn_down.weight' has type IQ2_XXS, which troupe cannot compute with yet");
  std::filesystem::remove(path);
  std::filesystem::remove(refused);
}

TEST_CASE("a quantized mixture of experts gives each prompt the same logits alone and batched",
          "[cpu][int8][moe]") {
  // The grouped expert path runs each expert once over every row routed to it: a prompt's
  // rows meet other prompts' rows in the same expert's tile, and must not be changed by them.
  const std::string path = write_model("moe-batch", TensorType::f32, Mix::q4_k_m, 256, 256, 8);
  auto loaded = model::LoadedModel::open(path, std::make_unique<cpu::CpuBackend>(2));
  REQUIRE(loaded.has_value());
  loaded->kv_dtype = KvCacheDtype::f32;
  REQUIRE(loaded->allocate_kv_cache(8, 16).has_value());
  const std::vector<std::vector<TokenId>> prompts = {
      {1, 300, 17, 42, 511, 260, 99, 3, 128}, {1, 5, 6, 7, 8}, {1, 400, 401, 12, 13, 14, 200}};
  auto run = [&](const std::vector<std::size_t>& which, std::int32_t first_block) {
    model::StepInput step;
    for (std::size_t i = 0; i < which.size(); ++i) {
      const std::vector<std::int32_t> block_table = {first_block + static_cast<std::int32_t>(i)};
      model::append_sequence(step, prompts[which[i]], 0, block_table, /*wants_logits=*/true);
    }
    std::vector<float> logits;
    REQUIRE(loaded->model->forward(step, logits).has_value());
    return logits;
  };
  const auto together = run({0, 1, 2}, 0);
  const std::size_t vocab = 512;
  REQUIRE(together.size() == 3 * vocab);
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    INFO("prompt " << p);
    const auto alone = run({p}, 3 + static_cast<std::int32_t>(p));
    REQUIRE(alone.size() == vocab);
    CHECK(std::equal(alone.begin(), alone.end(), together.begin() + p * vocab));
  }
  std::filesystem::remove(path);
}

TEST_CASE("olmoe with one head and every expert used computes what qwen3moe computes",
          "[cpu][moe]") {
  // With one head, olmoe's norm across heads is qwen3moe's per-head norm; with every expert
  // used, its unrenormalised weights are qwen3moe's renormalised ones up to rounding. The same
  // weights under both names must then give the same logits: olmoe's keys, tensor shapes,
  // RoPE and routing are read as llama.cpp reads them.
  model::RandomModelSpec spec;
  spec.arch = "olmoe";
  spec.dim = 64;
  spec.num_layers = 2;
  spec.num_heads = 1;
  spec.num_kv_heads = 1;
  spec.ffn_dim = 64;
  spec.num_experts = 4;
  spec.num_experts_used = 4;
  spec.expert_ffn_dim = 64;
  spec.vocab_size = 512;
  spec.stddev = 0.1f;
  spec.tied_output = false;
  const std::string olmoe = test::temp_path("olmoe-1head.gguf");
  REQUIRE(model::write_random_model(spec, olmoe).has_value());
  // The same file as qwen3moe: its keys renamed, the experts' FFN size under its own key, and
  // olmoe's eps and RoPE base kept.
  auto file = gguf::GgufFile::open(olmoe);
  REQUIRE(file.has_value());
  gguf::GgufWriter writer;
  for (const auto& [key, value] : file->metadata()) {
    if (key == "general.architecture") {
      writer.add_string(key, "qwen3moe");
    } else if (key.rfind("olmoe.", 0) == 0) {
      writer.add_value("qwen3moe." + key.substr(6), value);
    } else {
      writer.add_value(key, value);
    }
  }
  writer.add_uint32("qwen3moe.expert_feed_forward_length", 64);
  for (const auto& t : file->tensors()) {
    writer.add_tensor(t.name, t.type, std::vector<std::int64_t>(t.dims, t.dims + t.num_dims),
                      std::vector<std::byte>(t.data, t.data + t.num_bytes));
  }
  const std::string qwen = olmoe + ".qwen3moe.gguf";
  REQUIRE(writer.write(qwen).has_value());
  const auto got = prompt_logits(olmoe);
  const auto want = prompt_logits(qwen);
  REQUIRE(got.size() == want.size());
  double max_diff = 0.0, max_want = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double{got[i]} - want[i]));
    max_want = std::max(max_want, std::fabs(double{want[i]}));
  }
  INFO("largest difference " << max_diff << " of " << max_want);
  CHECK(max_want > 0.1);
  CHECK(max_diff <= 1e-5 * max_want);
  std::filesystem::remove(olmoe);
  std::filesystem::remove(qwen);
}
