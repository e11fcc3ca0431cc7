#include "model/llama_config.hpp"

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

}  // namespace

Result<LlamaConfig> LlamaConfig::from_gguf(const gguf::GgufFile& file) {
  LlamaConfig c;
  TROUPE_TRY(const auto arch, file.get_string("general.architecture"));
  c.architecture = std::string(arch);
  if (c.architecture != "llama" && c.architecture != "mistral") {
    return make_error(ErrorCode::unsupported, "unknown model architecture '" + c.architecture +
                                                  "' (troupe runs llama and mistral)");
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
  if (c.dim % c.num_heads != 0 || c.num_heads % c.num_kv_heads != 0) {
    return make_error(ErrorCode::invalid_file,
                      "model shape is inconsistent: " + std::to_string(c.num_heads) + " heads, " +
                          std::to_string(c.num_kv_heads) + " KV heads, dim " +
                          std::to_string(c.dim));
  }
  c.head_dim = c.dim / c.num_heads;
  if (file.find(p + "attention.key_length") != nullptr) {
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
  if (scaling == "linear") {
    TROUPE_TRY(const auto factor, file.get_float(p + "rope.scaling.factor"));
    if (!(factor > 0.0))
      return make_error(ErrorCode::invalid_file, "rope.scaling.factor must be positive");
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling != "none") {
    return make_error(ErrorCode::unsupported,
                      "rope scaling '" + scaling + "' is not supported yet");
  }

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
