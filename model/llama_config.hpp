// The shape and hyper-parameters of a Llama-family model, read from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

#include "gguf/gguf_file.hpp"
#include "model/backend.hpp"
#include "troupe/result.hpp"

namespace troupe::model {

struct LlamaConfig {
  std::string architecture;  // llama, qwen2, mistral, ...
  std::int32_t vocab_size = 0;
  std::int32_t dim = 0;
  std::int32_t num_layers = 0;
  std::int32_t num_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t ffn_dim = 0;
  std::int32_t context_length = 0;
  float norm_eps = 1e-5f;
  RopeLayout rope_layout = RopeLayout::normal;
  std::int32_t rope_dims = 0;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;

  static Result<LlamaConfig> from_gguf(const gguf::GgufFile& file);
};

}  // namespace troupe::model
