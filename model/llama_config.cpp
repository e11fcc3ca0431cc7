#include "model/llama_config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace troupe::model {

namespace {

Result<std::int32_t> read_count(const gguf::GgufFile& file, const std::string& key,
                                std::int64_t max) {
  TROUPE_TRY(const auto value, file.get_uint(key));
  if (value == 0 || value > static_cast<std::uint64_t>(max)) {
    return make_error(ErrorCode::invalid_file, "metadata key '" + key + "' is " +
                                                   std::to_string(value) + ", outside 1.." +
                                                   std::to_string(max));
  }
  return static_cast<std::int32_t>(value);
}

Result<float> read_positive(const gguf::GgufFile& file, const std::string& key) {
  TROUPE_TRY(const auto value, file.get_float(key));
  if (!(value > 0.0) || !std::isfinite(value)) {
    return make_error(ErrorCode::invalid_file, "metadata key '" + key + "' must be positive");
  }
  return static_cast<float>(value);
}

bool is_supported(const std::string& arch) {
  return arch == "llama" || arch == "mistral" || arch == "qwen2" || arch == "phi3" ||
         arch == "gemma2" || arch == "qwen3" || arch == "gemma3" || arch == "qwen3moe" ||
         arch == "gpt-oss" || arch == "olmoe";
}

// The experts of a mixture-of-experts file: {arch}.expert_count of them, expert_used_count
// per token, each with an FFN of expert_feed_forward_length where the file says (qwen3moe)
// or feed_forward_length (Mixtral's llama). A file without expert_count is dense.
Result<void> read_experts(const gguf::GgufFile& file, LlamaConfig& c) {
  const std::string p = c.architecture + ".";
  if (file.find(p + "expert_count") == nullptr) return {};
  TROUPE_TRY(const auto count, file.get_uint(p + "expert_count"));
  if (count == 0) return {};  // written as 0 by converters of dense models
  ArchFeatures& f = c.features;
  TROUPE_TRY(f.num_experts, read_count(file, p + "expert_count", 1 << 12));
  TROUPE_TRY(f.num_experts_used, read_count(file, p + "expert_used_count", f.num_experts));
  if (file.find(p + "expert_feed_forward_length") != nullptr) {
    TROUPE_TRY(c.ffn_dim, read_count(file, p + "expert_feed_forward_length", 1 << 20));
  }
  if (file.find(p + "expert_shared_count") != nullptr) {
    TROUPE_TRY(const auto shared, file.get_uint(p + "expert_shared_count"));
    if (shared != 0) {
      return make_error(ErrorCode::unsupported,
                        c.architecture + " with shared experts is not supported yet");
    }
  }
  return {};
}

// YaRN's parameters as llama.cpp reads and ggml's rope_yarn_corr_dims computes them: the
// pairs whose wavelength fits original_context_length / beta_fast times (below lo) keep
// their angle, those past beta_slow (above hi) are interpolated, a ramp between; cos and
// sin are scaled by attn_factor * (1 + 0.1 ln(factor)).
Result<void> read_yarn(const gguf::GgufFile& file, LlamaConfig& c) {
  const std::string p = c.architecture + ".rope.scaling.";
  auto optional_float = [&](const std::string& key, double fallback) -> Result<double> {
    if (file.find(p + key) == nullptr) return fallback;
    TROUPE_TRY(const auto value, file.get_float(p + key));
    if (!std::isfinite(value)) {
      return make_error(ErrorCode::invalid_file, "metadata key '" + p + key + "' is not finite");
    }
    return value;
  };
  TROUPE_TRY(const auto original, read_count(file, p + "original_context_length", 1 << 24));
  TROUPE_TRY(const auto beta_fast, optional_float("yarn_beta_fast", 32.0));
  TROUPE_TRY(const auto beta_slow, optional_float("yarn_beta_slow", 1.0));
  TROUPE_TRY(const auto attn_factor, optional_float("attn_factor", 1.0));
  if (!(beta_fast > 0.0 && beta_slow > 0.0)) {
    return make_error(ErrorCode::invalid_file, "YaRN's beta_fast and beta_slow must be positive");
  }
  const float n = static_cast<float>(c.rope_dims);
  const float base = c.rope_freq_base;
  const auto corr_dim = [&](double beta) {
    return n *
           std::log(static_cast<float>(original) /
                    (static_cast<float>(beta) * 2.0f * static_cast<float>(M_PI))) /
           (2.0f * std::log(base));
  };
  c.rope_ext_factor = 1.0f;
  c.rope_yarn_lo = std::max(0.0f, std::floor(corr_dim(beta_fast)));
  c.rope_yarn_hi = std::min(n - 1.0f, std::ceil(corr_dim(beta_slow)));
  c.rope_mscale =
      static_cast<float>(attn_factor) * (1.0f + 0.1f * std::log(1.0f / c.rope_freq_scale));
  c.features.yarn_rope = true;
  return {};
}

// A value_length other than the key length (head_dim) is not run: refused, named.
Result<void> check_value_length(const gguf::GgufFile& file, const LlamaConfig& c) {
  const std::string key = c.architecture + ".attention.value_length";
  if (file.find(key) == nullptr) return {};
  TROUPE_TRY(const auto value_length, read_count(file, key, 1 << 12));
  if (value_length != c.head_dim) {
    return make_error(ErrorCode::unsupported, c.architecture + " with attention.value_length " +
                                                  std::to_string(value_length) + " != key_length " +
                                                  std::to_string(c.head_dim));
  }
  return {};
}

// gemma3, as ik_llama.cpp (8337e4c) and llama.cpp read it: gemma2's blocks (post-norms,
// GELU, scaled embeddings, no softcaps) with Q/K norms, and five local layers (a window,
// RoPE base 10000 unscaled) to one global (the file's base and scaling).
Result<void> read_gemma3(const gguf::GgufFile& file, LlamaConfig& c) {
  const std::string p = c.architecture + ".";
  ArchFeatures& f = c.features;
  f.post_norms = true;
  f.activation = FfnActivation::gelu_tanh;
  f.embedding_scale = std::sqrt(static_cast<float>(c.dim));
  f.qk_norm = true;
  c.rope_layout = RopeLayout::neox;
  f.window_layers = WindowLayers::periodic;
  f.window_period = 6;
  f.local_rope_base = 10000.0f;
  TROUPE_TRY(f.sliding_window, read_count(file, p + "attention.sliding_window", 1 << 24));
  TROUPE_TRY_VOID(check_value_length(file, c));
  // The 27B (62 layers) scales queries by dim / heads; the others by the key length.
  c.attention_scale =
      1.0f / std::sqrt(static_cast<float>(c.num_layers == 62 ? c.dim / c.num_heads : c.head_dim));
  return {};
}

// gpt-oss, as ik_llama.cpp (8337e4c) reads it: biases on Q, K, V and the output projection,
// attention sinks, a window on even layers, YaRN (from the file's rope keys), and a
// mixture of experts with a biased router whose k largest logits are softmaxed, biased
// experts and a clamped SwiGLU; its pre-FFN norm is named post_attention_norm.
Result<void> read_gpt_oss(const gguf::GgufFile& file, LlamaConfig& c) {
  const std::string p = c.architecture + ".";
  ArchFeatures& f = c.features;
  if (f.num_experts == 0) {
    return make_error(ErrorCode::invalid_file, "gpt-oss without gpt-oss.expert_count");
  }
  f.qkv_bias = true;
  f.attn_output_bias = true;
  f.attention_sinks = true;
  f.ffn_norm_named_post_attention = true;
  f.routing = ExpertRouting::top_k_softmax;
  f.expert_activation = ExpertActivation::swiglu_oai;
  f.moe_biases = true;
  c.rope_layout = RopeLayout::neox;
  TROUPE_TRY(f.sliding_window, read_count(file, p + "attention.sliding_window", 1 << 24));
  f.window_layers = WindowLayers::even;
  return check_value_length(file, c);
}

// What qwen2, phi3, gemma2, qwen3, gemma3, qwen3moe and gpt-oss add to llama, as llama.cpp
// (b4747) reads the first three and ik_llama.cpp (8337e4c) the others.
Result<void> read_features(const gguf::GgufFile& file, LlamaConfig& c) {
  const std::string p = c.architecture + ".";
  ArchFeatures& f = c.features;
  if (c.architecture == "qwen2") {
    f.qkv_bias = true;
    c.rope_layout = RopeLayout::neox;
  } else if (c.architecture == "qwen3" || c.architecture == "qwen3moe") {
    f.qk_norm = true;
    c.rope_layout = RopeLayout::neox;
    TROUPE_TRY_VOID(check_value_length(file, c));
    if (c.architecture == "qwen3moe" && f.num_experts == 0) {
      return make_error(ErrorCode::invalid_file, "qwen3moe without qwen3moe.expert_count");
    }
  } else if (c.architecture == "olmoe") {
    // As llama.cpp reads it: Q/K norms over the whole projections, NEOX RoPE, and a softmax
    // router whose k largest probabilities weigh the experts unrenormalised.
    if (f.num_experts == 0) {
      return make_error(ErrorCode::invalid_file, "olmoe without olmoe.expert_count");
    }
    f.qk_norm_whole = true;
    f.routing = ExpertRouting::softmax_top_k_unnormalised;
    c.rope_layout = RopeLayout::neox;
    TROUPE_TRY_VOID(check_value_length(file, c));
  } else if (c.architecture == "gemma3") {
    TROUPE_TRY_VOID(read_gemma3(file, c));
  } else if (c.architecture == "gpt-oss") {
    TROUPE_TRY_VOID(read_gpt_oss(file, c));
  } else if (c.architecture == "phi3") {
    f.fused_qkv = true;
    f.fused_gate_up = true;
    c.rope_layout = RopeLayout::neox;
    // Phi-3 128K and Phi-3.5 rescale RoPE per frequency (LongRoPE): running them without
    // would be wrong past the short context, so they are refused until it is done.
    for (const char* name : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
      if (file.find_tensor(name) != nullptr) {
        return make_error(ErrorCode::unsupported,
                          std::string("phi3 with LongRoPE ('") + name + "') is not supported yet");
      }
    }
    // A window of 0 (Phi-4) means none; otherwise llama.cpp masks every layer with it.
    if (file.find(p + "attention.sliding_window") != nullptr) {
      TROUPE_TRY(const auto window, file.get_uint(p + "attention.sliding_window"));
      if (window > (1u << 24)) {
        return make_error(ErrorCode::invalid_file, "phi3.attention.sliding_window is too large");
      }
      f.sliding_window = static_cast<std::int32_t>(window);
      if (f.sliding_window > 0) f.window_layers = WindowLayers::all;
    }
  } else if (c.architecture == "gemma2") {
    f.post_norms = true;
    f.activation = FfnActivation::gelu_tanh;
    f.embedding_scale = std::sqrt(static_cast<float>(c.dim));
    c.rope_layout = RopeLayout::neox;
    // llama.cpp's defaults where the keys are absent.
    f.attention_softcap = 50.0f;
    f.final_softcap = 30.0f;
    f.sliding_window = 4096;
    f.window_layers = WindowLayers::even;
    if (file.find(p + "attn_logit_softcapping") != nullptr) {
      TROUPE_TRY(f.attention_softcap, read_positive(file, p + "attn_logit_softcapping"));
    }
    if (file.find(p + "final_logit_softcapping") != nullptr) {
      TROUPE_TRY(f.final_softcap, read_positive(file, p + "final_logit_softcapping"));
    }
    if (file.find(p + "attention.sliding_window") != nullptr) {
      TROUPE_TRY(f.sliding_window, read_count(file, p + "attention.sliding_window", 1 << 24));
    }
    TROUPE_TRY_VOID(check_value_length(file, c));
    // llama.cpp scales queries by its model type, which it picks from the layer count:
    // 1/sqrt(key_length) for 2B (26) and 9B (42), 1/sqrt(dim/heads) for 27B (46).
    if (c.num_layers == 26 || c.num_layers == 42) {
      c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    } else if (c.num_layers == 46) {
      c.attention_scale = 1.0f / std::sqrt(static_cast<float>(c.dim / c.num_heads));
    } else {
      return make_error(ErrorCode::unsupported,
                        "gemma2 with " + std::to_string(c.num_layers) +
                            " layers: its query scale is defined (as llama.cpp does) only for "
                            "26, 42 or 46 layers");
    }
  }
  return {};
}

}  // namespace

std::string ArchFeatures::op_names() const {
  std::string out;
  const auto name = [&](bool on, const char* what) {
    if (!on) return;
    if (!out.empty()) out += ", ";
    out += what;
  };
  name(qkv_bias, "Q/K/V biases");
  name(activation == FfnActivation::gelu_tanh, "GELU-tanh FFN");
  name(embedding_scale != 1.0f, "embedding scale");
  name(attention_softcap > 0.0f, "attention softcap");
  name(final_softcap > 0.0f, "final logit softcap");
  name(window_layers != WindowLayers::none && sliding_window > 0, "sliding window");
  name(qk_norm_whole, "Q/K norms across heads");
  name(num_experts > 0, "mixture of experts");
  name(attn_output_bias, "attention output bias");
  name(attention_sinks, "attention sinks");
  name(yarn_rope, "YaRN RoPE");
  return out;
}

// Backend's default, here beside the feature names it reports: a backend that does not
// say otherwise runs llama's ops only.
Result<void> Backend::supports(const ArchFeatures& features) const {
  const std::string missing = features.op_names();
  if (missing.empty()) return {};
  return make_error(ErrorCode::unsupported,
                    describe() + " does not implement this model's " + missing + " yet");
}

Result<LlamaConfig> LlamaConfig::from_gguf(const gguf::GgufFile& file) {
  LlamaConfig c;
  TROUPE_TRY(const auto arch, file.get_string("general.architecture"));
  c.architecture = std::string(arch);
  if (!is_supported(c.architecture)) {
    return make_error(ErrorCode::unsupported,
                      "unknown model architecture '" + c.architecture +
                          "' (troupe runs llama, mistral, qwen2, phi3, gemma2, qwen3, qwen3moe and "
                          "gemma3)");
  }
  const std::string p = c.architecture + ".";
  TROUPE_TRY(c.dim, read_count(file, p + "embedding_length", 1 << 16));
  TROUPE_TRY(c.num_layers, read_count(file, p + "block_count", 1024));
  TROUPE_TRY(c.num_heads, read_count(file, p + "attention.head_count", 1024));
  c.num_kv_heads = c.num_heads;
  if (file.find(p + "attention.head_count_kv") != nullptr) {
    TROUPE_TRY(c.num_kv_heads, read_count(file, p + "attention.head_count_kv", 1024));
  }
  TROUPE_TRY(c.ffn_dim, read_count(file, p + "feed_forward_length", 1 << 20));
  c.context_length = 2048;
  if (file.find(p + "context_length") != nullptr) {
    TROUPE_TRY(c.context_length, read_count(file, p + "context_length", 1 << 24));
  }
  const bool head_dim_given = file.find(p + "attention.key_length") != nullptr;
  if ((!head_dim_given && c.dim % c.num_heads != 0) || c.num_heads % c.num_kv_heads != 0) {
    return make_error(ErrorCode::invalid_file,
                      "model shape is inconsistent: " + std::to_string(c.num_heads) + " heads, " +
                          std::to_string(c.num_kv_heads) + " KV heads, dim " +
                          std::to_string(c.dim));
  }
  c.head_dim = c.dim / c.num_heads;
  if (head_dim_given) {
    TROUPE_TRY(c.head_dim, read_count(file, p + "attention.key_length", 1 << 12));
  }
  if (c.head_dim % 2 != 0) {
    return make_error(ErrorCode::invalid_file,
                      "head dimension " + std::to_string(c.head_dim) + " is odd");
  }
  if (file.find(p + "attention.layer_norm_rms_epsilon") != nullptr) {
    TROUPE_TRY(const auto eps, file.get_float(p + "attention.layer_norm_rms_epsilon"));
    c.norm_eps = static_cast<float>(eps);
  }
  c.rope_dims = c.head_dim;
  if (file.find(p + "rope.dimension_count") != nullptr) {
    TROUPE_TRY(c.rope_dims, read_count(file, p + "rope.dimension_count", c.head_dim));
    if (c.rope_dims % 2 != 0) {
      return make_error(ErrorCode::invalid_file, "rope.dimension_count is odd");
    }
  }
  if (file.find(p + "rope.freq_base") != nullptr) {
    TROUPE_TRY(const auto base, file.get_float(p + "rope.freq_base"));
    if (!(base > 1.0)) return make_error(ErrorCode::invalid_file, "rope.freq_base must exceed 1");
    c.rope_freq_base = static_cast<float>(base);
  }
  std::string scaling = "none";
  if (file.find(p + "rope.scaling.type") != nullptr) {
    TROUPE_TRY(const auto type, file.get_string(p + "rope.scaling.type"));
    scaling = std::string(type);
  }
  if (scaling == "linear" || scaling == "yarn") {
    TROUPE_TRY(const auto factor, file.get_float(p + "rope.scaling.factor"));
    if (!(factor > 0.0))
      return make_error(ErrorCode::invalid_file, "rope.scaling.factor must be positive");
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  }
  if (scaling == "yarn") {
    TROUPE_TRY_VOID(read_yarn(file, c));
  } else if (scaling != "none" && scaling != "linear") {
    return make_error(ErrorCode::unsupported,
                      "rope scaling '" + scaling + "' is not supported yet");
  }

  TROUPE_TRY_VOID(read_experts(file, c));
  TROUPE_TRY_VOID(read_features(file, c));

  const gguf::GgufTensorInfo* embedding = file.find_tensor("token_embd.weight");
  if (embedding == nullptr) {
    return make_error(ErrorCode::invalid_file, "missing tensor 'token_embd.weight'");
  }
  if (embedding->dims[0] != c.dim ||
      embedding->dims[1] > std::numeric_limits<std::int32_t>::max()) {
    return make_error(ErrorCode::invalid_file,
                      "tensor 'token_embd.weight' does not match dim " + std::to_string(c.dim));
  }
  c.vocab_size = static_cast<std::int32_t>(embedding->dims[1]);
  return c;
}

}  // namespace troupe::model
