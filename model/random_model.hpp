// Random-weight models of any shape, written as real GGUF files (like vLLM's dummy load
// format): the built-in default model and the benchmark models. Llama (dense, or
// Mixtral-style with experts), Qwen3, Qwen3-MoE and OLMoE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/tensor_type.hpp"
#include "troupe/result.hpp"

namespace troupe::model {

struct RandomModelSpec {
  std::string name = "troupe-random";
  // "llama" (with num_experts > 0: Mixtral-style), "qwen3" or "qwen3moe" (per-head Q/K
  // norms, NEOX RoPE, base 1e6), or "olmoe" (Q/K norms across heads, NEOX RoPE, experts).
  std::string arch = "llama";
  std::int32_t dim = 288;
  std::int32_t num_layers = 6;
  std::int32_t num_heads = 6;
  std::int32_t num_kv_heads = 6;
  std::int32_t ffn_dim = 768;
  std::int32_t head_dim = 0;  // 0: dim / num_heads
  // A routed FFN: num_experts experts of expert_ffn_dim, num_experts_used a token (qwen3moe
  // needs them; llama with them is Mixtral-style). Stacked in 3-D tensors, as files ship.
  std::int32_t num_experts = 0;
  std::int32_t num_experts_used = 0;
  std::int32_t expert_ffn_dim = 0;
  std::int32_t vocab_size = 32000;  // for the built-in vocabulary; a copied one brings its own
  std::int32_t context_length = 2048;
  gguf::TensorType type = gguf::TensorType::f32;  // of the matrices; norms are always F32
  // One of llama.cpp's mixes instead of one type (its llama_tensor_get_type for a dense
  // model, the stacked experts taken as the dense matrices they replace), `type` then unused:
  // Q4_K_M is Q4_K with Q6_K for the output (or the tied embedding) and for attn_v and ffn_down in
  // the layers its `use_more_bits` picks; Q3_K_M is Q3_K with Q6_K output, Q5_K attn_v in the first
  // two layers and Q4_K after, Q4_K attn_output, and Q5_K ffn_down in the first sixteenth of the
  // layers, Q4_K after; the Q2_K file type is Q2_K with Q6_K output, Q3_K attn_output and ffn_down,
  // and attn_v in Q4_K where 4 or more query heads share a KV head, else Q3_K.
  enum class Mix { none, q4_k_m, q3_k_m, q2_k };
  Mix mix = Mix::none;
  bool tied_output = true;
  std::uint64_t seed = 1234;
  float stddev = 0.02f;
  // A GGUF file whose tokenizer to copy (e.g. a vocabulary-only file); empty:
  // a built-in SentencePiece vocabulary that needs nothing from outside.
  std::string vocab_path;
};

// Named shapes: "tiny" (the stories15M shape, ~15M parameters with a 32000 vocabulary),
// "110m" (dim 768, 12 layers, 12 heads, 4 KV heads, FFN 2048: ~110M with 32000) and
// "moe" (Qwen3-30B-A3B's proportions scaled down: qwen3moe, dim 1024, 8 layers, 16 heads,
// 4 KV heads, head_dim 64, 32 experts of FFN 512 with 4 active: ~0.49B parameters with a
// 32000 vocabulary, ~0.1B of them read a token).
Result<RandomModelSpec> random_model_preset(const std::string& name);

Result<void> write_random_model(const RandomModelSpec& spec, const std::string& path);

// A random LoRA adapter for a base model file, in llama.cpp's adapter layout
// (model/lora_adapter.hpp): the benchmarks' adapters, of any rank and targets.
struct RandomAdapterSpec {
  std::string base_path;  // the base model's GGUF file: its architecture and matrix shapes
  std::int64_t rank = 16;
  float alpha = 16.0f;
  // Matrix names (lora_target_name: "attn_q" ... "ffn_down"); empty: every one the base
  // model has as a separate matrix.
  std::vector<std::string> targets;
  gguf::TensorType type = gguf::TensorType::f32;  // F32 or F16
  std::uint64_t seed = 1;
  float stddev = 0.02f;  // of A's and B's values
};

Result<void> write_random_adapter(const RandomAdapterSpec& spec, const std::string& path);

// n normal values of the given spread, fixed by `seed` (Box-Muller over splitmix64), and the
// per-tensor seed offset of a name (FNV-1a): what the random models and adapters are made of.
std::vector<float> random_normal_values(std::size_t n, float stddev, std::uint64_t seed);
std::uint64_t random_name_hash(const std::string& name);

}  // namespace troupe::model
