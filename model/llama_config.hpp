// The shape and hyper-parameters of a Llama-family model (llama, mistral, qwen2, phi3,
// gemma2, qwen3, gemma3), read from GGUF metadata, with what sets each architecture apart
// named as features the one forward recipe switches on.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "gguf/gguf_file.hpp"
#include "model/backend.hpp"
#include "troupe/result.hpp"

namespace troupe::model {

enum class FfnActivation {
  silu,       // down(silu(gate) * up): llama, qwen2, phi3
  gelu_tanh,  // down(gelu_tanh(gate) * up): gemma2
};

// Which layers attend only to a window of recent keys.
enum class WindowLayers {
  none,
  all,       // phi3 (when its sliding_window is not 0)
  even,      // gemma2: layers 0, 2, 4, ...
  periodic,  // gemma3: all but every window_period-th (layer il global when (il+1) % period == 0)
};

// What an architecture adds to the llama recipe. The defaults are llama's.
struct ArchFeatures {
  bool qkv_bias = false;       // blk.N.attn_{q,k,v}.bias added to the projections (qwen2)
  bool fused_qkv = false;      // blk.N.attn_qkv: Q rows, then K, then V (phi3)
  bool fused_gate_up = false;  // blk.N.ffn_up: the gate rows, then the up rows (phi3)
  bool post_norms = false;     // blk.N.post_attention_norm / post_ffw_norm on each block's
                               // output before the residual add (gemma2)
  FfnActivation activation = FfnActivation::silu;
  float embedding_scale = 1.0f;     // x = token_embd[id] * embedding_scale (gemma2: sqrt(dim))
  float attention_softcap = 0.0f;   // scores = cap * tanh(scores / cap); 0: none (gemma2)
  float final_softcap = 0.0f;       // logits = cap * tanh(logits / cap); 0: none (gemma2)
  std::int32_t sliding_window = 0;  // keys at positions j with 0 <= p - j < window; 0: none
  WindowLayers window_layers = WindowLayers::none;
  std::int32_t window_period = 0;  // WindowLayers::periodic's period (gemma3: 6)
  // blk.N.attn_q_norm / attn_k_norm [head_dim]: each query and key head RMS-normalised (the
  // model's eps, one weight for all heads) before RoPE (qwen3, gemma3).
  bool qk_norm = false;
  // blk.N.attn_q_norm [heads * head_dim] / attn_k_norm [kv_heads * head_dim]: the whole query
  // and key projections RMS-normalised, across every head, before RoPE (olmoe).
  bool qk_norm_whole = false;
  // The RoPE base of the windowed (local) layers, which then have no position scaling
  // either; 0: the model's RoPE on every layer (gemma3: 10000 on local layers, the file's
  // base and linear scaling on global ones).
  float local_rope_base = 0.0f;

  // A mixture-of-experts FFN in every layer (0: a dense one): the router
  // (blk.N.ffn_gate_inp) picks num_experts_used of num_experts per token (each of
  // LlamaConfig::ffn_dim), as `routing` says; biases on the router and the experts
  // (gpt-oss).
  std::int32_t num_experts = 0;
  std::int32_t num_experts_used = 0;
  ExpertRouting routing = ExpertRouting::softmax_top_k;
  ExpertActivation expert_activation = ExpertActivation::silu;
  bool moe_biases = false;
  bool attn_output_bias = false;  // blk.N.attn_output.bias after the output projection (gpt-oss)
  bool attention_sinks = false;   // blk.N.attn_sinks [heads]: AttentionParams::sinks (gpt-oss)
  // The pre-FFN norm is named blk.N.post_attention_norm (gpt-oss), not ffn_norm.
  bool ffn_norm_named_post_attention = false;
  bool yarn_rope = false;  // LlamaConfig's rope_ext_factor and its YaRN ramp (a backend op's)

  // The window of `layer` (0: it attends to every earlier key).
  std::int32_t window_of(std::int32_t layer) const {
    switch (window_layers) {
      case WindowLayers::none:
        return 0;
      case WindowLayers::all:
        return sliding_window;
      case WindowLayers::even:
        return layer % 2 == 0 ? sliding_window : 0;
      case WindowLayers::periodic:
        return (layer + 1) % window_period != 0 ? sliding_window : 0;
    }
    return 0;
  }
  // The features that need backend ops beyond llama's, named for an error message
  // ("attention softcap, sliding window"); empty for llama. (Fused tensors are cut apart
  // at load and post-norms are RMSNorms: any backend runs those.)
  std::string op_names() const;
};

struct LlamaConfig {
  // llama, mistral, qwen2, phi3, gemma2, qwen3, gemma3, qwen3moe, gpt-oss
  std::string architecture;
  std::int32_t vocab_size = 0;
  std::int32_t dim = 0;
  std::int32_t num_layers = 0;
  std::int32_t num_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t ffn_dim = 0;  // a mixture of experts: each expert's
  std::int32_t context_length = 0;
  float norm_eps = 1e-5f;
  RopeLayout rope_layout = RopeLayout::normal;
  std::int32_t rope_dims = 0;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;
  // YaRN (rope.scaling.type yarn; RopeParams says how): ext_factor 1, the ramp between the
  // frequency pairs lo and hi, and cos and sin scaled by mscale.
  float rope_ext_factor = 0.0f;
  float rope_yarn_lo = 0.0f, rope_yarn_hi = 0.0f;
  float rope_mscale = 1.0f;
  float attention_scale = 0.0f;  // on q.k; 0: 1 / sqrt(head_dim)
  ArchFeatures features;

  float query_scale() const {
    return attention_scale > 0.0f ? attention_scale
                                  : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }

  static Result<LlamaConfig> from_gguf(const gguf::GgufFile& file);
};

}  // namespace troupe::model
