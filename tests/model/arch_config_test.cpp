// What LlamaConfig reads of each architecture's metadata into its features, and which
// files it refuses (by name) rather than run wrongly.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "gguf/dequantize.hpp"
#include "gguf/gguf_file.hpp"
#include "gguf/gguf_writer.hpp"
#include "model/llama_config.hpp"
#include "model/loaded_model.hpp"

using namespace troupe;
using namespace troupe::gguf;
using namespace troupe::model;

namespace {

// The metadata of a small model of `arch` (dim 64, 4 heads, 2 KV heads) and its
// embedding table; `extra` adds keys.
Result<LlamaConfig> config_of(const std::string& arch, std::uint32_t layers,
                              const std::function<void(GgufWriter&)>& extra = {}) {
  GgufWriter w;
  w.add_string("general.architecture", arch);
  w.add_uint32(arch + ".embedding_length", 64);
  w.add_uint32(arch + ".block_count", layers);
  w.add_uint32(arch + ".feed_forward_length", 96);
  w.add_uint32(arch + ".attention.head_count", 4);
  w.add_uint32(arch + ".attention.head_count_kv", 2);
  if (extra) extra(w);
  const std::vector<float> table(64 * 8, 0.5f);
  w.add_tensor("token_embd.weight", TensorType::f32, {64, 8},
               *quantize(TensorType::f32, table, 64));
  const auto bytes = w.to_bytes();
  auto file = GgufFile::parse(bytes);
  REQUIRE(file.has_value());
  return LlamaConfig::from_gguf(*file);
}

}  // namespace

TEST_CASE("an unknown architecture is refused by its name", "[model]") {
  const auto config = config_of("falcon", 2);
  REQUIRE_FALSE(config.has_value());
  CHECK(config.error().message.find("'falcon'") != std::string::npos);
}

TEST_CASE("llama needs no feature beyond the recipe's own", "[model]") {
  const auto config = config_of("llama", 2);
  REQUIRE(config.has_value());
  CHECK(config->rope_layout == RopeLayout::normal);
  CHECK(config->features.op_names().empty());
  CHECK(config->query_scale() == 1.0f / std::sqrt(16.0f));
}

TEST_CASE("qwen2 adds Q/K/V biases and NEOX RoPE", "[model]") {
  const auto config = config_of("qwen2", 2);
  REQUIRE(config.has_value());
  CHECK(config->features.qkv_bias);
  CHECK(config->rope_layout == RopeLayout::neox);
  CHECK(config->features.window_of(0) == 0);
}

TEST_CASE("phi3 fuses QKV and gate-up and windows every layer unless its window is 0", "[model]") {
  SECTION("a window of 48") {
    const auto config = config_of(
        "phi3", 3, [](GgufWriter& w) { w.add_uint32("phi3.attention.sliding_window", 48); });
    REQUIRE(config.has_value());
    CHECK(config->features.fused_qkv);
    CHECK(config->features.fused_gate_up);
    CHECK(config->rope_layout == RopeLayout::neox);
    for (std::int32_t layer = 0; layer < 3; ++layer) CHECK(config->features.window_of(layer) == 48);
  }
  SECTION("LongRoPE (Phi-3 128K) is refused by its tensor's name") {
    const auto config = config_of("phi3", 3, [](GgufWriter& w) {
      const std::vector<float> factors(8, 1.0f);
      w.add_tensor("rope_factors_long.weight", TensorType::f32, {8},
                   *quantize(TensorType::f32, factors, 8));
    });
    REQUIRE_FALSE(config.has_value());
    CHECK(config.error().message.find("rope_factors_long") != std::string::npos);
  }
  SECTION("a window of 0 (Phi-4) is no window") {
    const auto config = config_of(
        "phi3", 3, [](GgufWriter& w) { w.add_uint32("phi3.attention.sliding_window", 0); });
    REQUIRE(config.has_value());
    CHECK(config->features.window_of(0) == 0);
    CHECK(config->features.op_names().empty());
  }
}

TEST_CASE("gemma2 reads its softcaps, window and head size, and scales queries as llama.cpp",
          "[model]") {
  const auto gemma2 = [](std::uint32_t layers) {
    return config_of("gemma2", layers, [](GgufWriter& w) {
      w.add_uint32("gemma2.attention.key_length", 32);
      w.add_uint32("gemma2.attention.value_length", 32);
      w.add_float32("gemma2.attn_logit_softcapping", 50.0f);
      w.add_float32("gemma2.final_logit_softcapping", 30.0f);
      w.add_uint32("gemma2.attention.sliding_window", 32);
    });
  };
  SECTION("26 layers (2B): 1/sqrt(key_length)") {
    const auto config = gemma2(26);
    REQUIRE(config.has_value());
    const auto& f = config->features;
    CHECK(config->head_dim == 32);
    CHECK(config->query_scale() == 1.0f / std::sqrt(32.0f));
    CHECK(f.post_norms);
    CHECK(f.activation == FfnActivation::gelu_tanh);
    CHECK(f.embedding_scale == std::sqrt(64.0f));
    CHECK(f.attention_softcap == 50.0f);
    CHECK(f.final_softcap == 30.0f);
    CHECK(f.window_of(0) == 32);
    CHECK(f.window_of(1) == 0);
    CHECK(f.window_of(24) == 32);
    CHECK(f.op_names() ==
          "GELU-tanh FFN, embedding scale, attention softcap, final logit softcap, sliding window");
  }
  SECTION("46 layers (27B): 1/sqrt(dim / heads)") {
    const auto config = gemma2(46);
    REQUIRE(config.has_value());
    CHECK(config->query_scale() == 1.0f / std::sqrt(16.0f));
  }
  SECTION("another layer count has no query scale in llama.cpp: refused") {
    const auto config = gemma2(12);
    REQUIRE_FALSE(config.has_value());
    CHECK(config.error().message.find("gemma2 with 12 layers") != std::string::npos);
  }
  SECTION("a softcap that is not positive is a bad file") {
    const auto config = config_of(
        "gemma2", 26, [](GgufWriter& w) { w.add_float32("gemma2.attn_logit_softcapping", -1.0f); });
    REQUIRE_FALSE(config.has_value());
    CHECK(config.error().message.find("attn_logit_softcapping") != std::string::npos);
  }
}

TEST_CASE("qwen3 adds per-head Q/K norms and NEOX RoPE, with its own head size", "[model]") {
  const auto config = config_of("qwen3", 2, [](GgufWriter& w) {
    w.add_uint32("qwen3.attention.key_length", 32);
    w.add_uint32("qwen3.attention.value_length", 32);
  });
  REQUIRE(config.has_value());
  CHECK(config->features.qk_norm);
  CHECK(config->rope_layout == RopeLayout::neox);
  CHECK(config->head_dim == 32);  // not dim / heads (16)
  CHECK(config->query_scale() == 1.0f / std::sqrt(32.0f));
  CHECK(config->features.window_of(1) == 0);
  const auto other = config_of("qwen3", 2, [](GgufWriter& w) {
    w.add_uint32("qwen3.attention.key_length", 32);
    w.add_uint32("qwen3.attention.value_length", 16);
  });
  REQUIRE_FALSE(other.has_value());
  CHECK_THAT(other.error().message, Catch::Contains("value_length 16"));
}

TEST_CASE("gemma3 has five local layers to one global, each kind with its own RoPE", "[model]") {
  const auto config = config_of("gemma3", 12, [](GgufWriter& w) {
    w.add_uint32("gemma3.attention.key_length", 32);
    w.add_uint32("gemma3.attention.sliding_window", 32);
    w.add_float32("gemma3.rope.freq_base", 1e6f);
    w.add_string("gemma3.rope.scaling.type", "linear");
    w.add_float32("gemma3.rope.scaling.factor", 8.0f);
  });
  REQUIRE(config.has_value());
  const ArchFeatures& f = config->features;
  CHECK(f.qk_norm);
  CHECK(f.post_norms);
  CHECK(f.activation == FfnActivation::gelu_tanh);
  CHECK(f.embedding_scale == std::sqrt(64.0f));
  CHECK(f.attention_softcap == 0.0f);  // no softcaps, unlike gemma2
  CHECK(f.final_softcap == 0.0f);
  for (std::int32_t layer = 0; layer < 12; ++layer) {
    INFO("layer " << layer);
    CHECK(f.window_of(layer) == ((layer == 5 || layer == 11) ? 0 : 32));
  }
  CHECK(f.local_rope_base == 10000.0f);
  CHECK(config->rope_freq_base == 1e6f);  // the global layers'
  CHECK(config->rope_freq_scale == 1.0f / 8.0f);
  CHECK(config->query_scale() == 1.0f / std::sqrt(32.0f));  // any layer count loads
  // The 27B's 62 layers scale queries by dim / heads.
  const auto big = config_of("gemma3", 62, [](GgufWriter& w) {
    w.add_uint32("gemma3.attention.key_length", 32);
    w.add_uint32("gemma3.attention.sliding_window", 1024);
  });
  REQUIRE(big.has_value());
  CHECK(big->query_scale() == 1.0f / std::sqrt(16.0f));
  // A window is what makes its local layers local: without one it is refused.
  const auto no_window = config_of("gemma3", 6);
  REQUIRE_FALSE(no_window.has_value());
  CHECK_THAT(no_window.error().message, Catch::Contains("sliding_window"));
}

TEST_CASE("qwen3moe and Mixtral-style llama read their experts, each of its own FFN size",
          "[model]") {
  const auto qwen = config_of("qwen3moe", 2, [](GgufWriter& w) {
    w.add_uint32("qwen3moe.expert_count", 16);
    w.add_uint32("qwen3moe.expert_used_count", 4);
    w.add_uint32("qwen3moe.expert_feed_forward_length", 32);
  });
  REQUIRE(qwen.has_value());
  CHECK(qwen->features.num_experts == 16);
  CHECK(qwen->features.num_experts_used == 4);
  CHECK(qwen->ffn_dim == 32);  // the experts', not feed_forward_length (96)
  CHECK(qwen->features.qk_norm);
  CHECK(qwen->features.routing == ExpertRouting::softmax_top_k);
  CHECK_THAT(qwen->features.op_names(), Catch::Contains("mixture of experts"));
  const auto mixtral = config_of("llama", 2, [](GgufWriter& w) {
    w.add_uint32("llama.expert_count", 8);
    w.add_uint32("llama.expert_used_count", 2);
  });
  REQUIRE(mixtral.has_value());
  CHECK(mixtral->features.num_experts == 8);
  CHECK(mixtral->ffn_dim == 96);
  const auto dense =
      config_of("llama", 2, [](GgufWriter& w) { w.add_uint32("llama.expert_count", 0); });
  REQUIRE(dense.has_value());
  CHECK(dense->features.num_experts == 0);
  const auto too_many = config_of("qwen3moe", 2, [](GgufWriter& w) {
    w.add_uint32("qwen3moe.expert_count", 4);
    w.add_uint32("qwen3moe.expert_used_count", 5);
  });
  REQUIRE_FALSE(too_many.has_value());
  CHECK_THAT(too_many.error().message, Catch::Contains("expert_used_count"));
  const auto shared = config_of("qwen3moe", 2, [](GgufWriter& w) {
    w.add_uint32("qwen3moe.expert_count", 4);
    w.add_uint32("qwen3moe.expert_used_count", 2);
    w.add_uint32("qwen3moe.expert_shared_count", 1);
  });
  REQUIRE_FALSE(shared.has_value());
  CHECK_THAT(shared.error().message, Catch::Contains("shared experts"));
  const auto no_experts = config_of("qwen3moe", 2);
  REQUIRE_FALSE(no_experts.has_value());
  // OLMoE: the experts' FFN is feed_forward_length, Q/K norms span the heads, and the
  // chosen probabilities weigh the experts as they are.
  const auto olmoe = config_of("olmoe", 2, [](GgufWriter& w) {
    w.add_uint32("olmoe.expert_count", 64);
    w.add_uint32("olmoe.expert_used_count", 8);
  });
  REQUIRE(olmoe.has_value());
  CHECK(olmoe->features.num_experts == 64);
  CHECK(olmoe->ffn_dim == 96);
  CHECK(olmoe->features.qk_norm_whole);
  CHECK_FALSE(olmoe->features.qk_norm);
  CHECK(olmoe->rope_layout == RopeLayout::neox);
  CHECK(olmoe->features.routing == ExpertRouting::softmax_top_k_unnormalised);
  CHECK_THAT(olmoe->features.op_names(), Catch::Contains("Q/K norms across heads"));
  REQUIRE_FALSE(config_of("olmoe", 2).has_value());
}

TEST_CASE("gpt-oss reads YaRN as ggml computes its ramp and scale", "[model]") {
  const auto config = config_of("gpt-oss", 4, [](GgufWriter& w) {
    w.add_uint32("gpt-oss.attention.key_length", 32);
    w.add_uint32("gpt-oss.attention.value_length", 32);
    w.add_uint32("gpt-oss.attention.sliding_window", 32);
    w.add_float32("gpt-oss.rope.freq_base", 150000.0f);
    w.add_string("gpt-oss.rope.scaling.type", "yarn");
    w.add_float32("gpt-oss.rope.scaling.factor", 32.0f);
    w.add_uint32("gpt-oss.rope.scaling.original_context_length", 4096);
    w.add_uint32("gpt-oss.expert_count", 8);
    w.add_uint32("gpt-oss.expert_used_count", 4);
    w.add_uint32("gpt-oss.expert_feed_forward_length", 64);
  });
  REQUIRE(config.has_value());
  // lo = floor(c(32)) and hi = ceil(c(1)), c(b) = 32 ln(4096 / (2 pi b)) / (2 ln 150000).
  CHECK(config->rope_yarn_lo == 4.0f);
  CHECK(config->rope_yarn_hi == 9.0f);
  CHECK(config->rope_ext_factor == 1.0f);
  CHECK(config->rope_freq_scale == 1.0f / 32.0f);
  CHECK(config->rope_mscale == Approx(1.0 + 0.1 * std::log(32.0)).epsilon(1e-6));
  const ArchFeatures& f = config->features;
  CHECK(f.attention_sinks);
  CHECK(f.attn_output_bias);
  CHECK(f.qkv_bias);
  CHECK(f.moe_biases);
  CHECK(f.routing == ExpertRouting::top_k_softmax);
  CHECK(f.expert_activation == ExpertActivation::swiglu_oai);
  CHECK(f.ffn_norm_named_post_attention);
  CHECK(f.window_of(0) == 32);
  CHECK(f.window_of(1) == 0);
  CHECK_THAT(f.op_names(), Catch::Contains("attention sinks") && Catch::Contains("YaRN"));
}

TEST_CASE("expert tensors are known stacked and one per expert, and nothing else is", "[model]") {
  for (const char* name :
       {"blk.0.ffn_gate_exps.weight", "blk.12.ffn_down_exps.weight", "blk.3.ffn_up_exps.bias",
        "blk.0.ffn_gate.0.weight", "blk.31.ffn_down.7.weight", "blk.1.ffn_up.15.weight"}) {
    INFO(name);
    CHECK(model::is_expert_tensor(name));
  }
  for (const char* name : {"blk.0.ffn_gate.weight", "blk.0.ffn_down.weight", "token_embd.weight",
                           "blk.0.ffn_gate_inp.weight", "blk.0.attn_q.weight", "blk.0.ffn_up."}) {
    INFO(name);
    CHECK_FALSE(model::is_expert_tensor(name));
  }
}
