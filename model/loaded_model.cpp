#include "model/loaded_model.hpp"

#include "model/pipeline_parallel.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstring>

namespace troupe::model {

namespace {

// FNV-1a, 64 bits.
struct Fnv {
  std::uint64_t h = 0xcbf29ce484222325ull;
  void add(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  }
  template <typename T>
  void add_value(const T& value) {
    add(&value, sizeof(value));
  }
};

}  // namespace

bool is_expert_tensor(std::string_view name) {
  if (name.find("_exps.") != std::string_view::npos) return true;
  for (const std::string_view ffn : {".ffn_gate.", ".ffn_up.", ".ffn_down."}) {
    const auto at = name.find(ffn);
    if (at != std::string_view::npos && at + ffn.size() < name.size() &&
        std::isdigit(static_cast<unsigned char>(name[at + ffn.size()]))) {
      return true;
    }
  }
  return false;
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

StepWeightBytes step_weight_bytes(const gguf::GgufFile& file, const LlamaConfig& config) {
  StepWeightBytes out;
  out.layers.assign(static_cast<std::size_t>(std::max(0, config.num_layers)), 0.0);
  const double expert_share =
      config.features.num_experts > 0 && config.features.num_experts_used > 0
          ? static_cast<double>(config.features.num_experts_used) /
                static_cast<double>(config.features.num_experts)
          : 1.0;
  double embedding = 0.0;
  bool has_output = false;
  for (const auto& t : file.tensors()) {
    const std::string_view name = t.name;
    const auto bytes = static_cast<double>(t.num_bytes);
    if (name.starts_with("blk.")) {
      std::int32_t layer = -1;
      const auto digits = name.substr(4);
      const auto [end, error] =
          std::from_chars(digits.data(), digits.data() + digits.size(), layer);
      if (error != std::errc{} || layer < 0 || layer >= config.num_layers) continue;
      out.layers[static_cast<std::size_t>(layer)] +=
          is_expert_tensor(name) ? bytes * expert_share : bytes;
    } else if (name.starts_with("output")) {  // output.weight, output_norm.weight, ...
      out.head += bytes;
      has_output = has_output || name.starts_with("output.");
    } else if (name.starts_with("token_embd.")) {
      embedding += bytes;
    }
  }
  if (!has_output) out.head += embedding;  // tied: the head reads the embedding
  return out;
}

std::vector<std::int32_t> weight_balanced_partition(const gguf::GgufFile& file,
                                                    const LlamaConfig& config,
                                                    std::int32_t num_stages) {
  const StepWeightBytes costs = step_weight_bytes(file, config);
  return balance_layers(costs.layers, costs.head, num_stages);
}

std::int64_t tensor_bytes(const gguf::GgufFile& file) {
  std::int64_t bytes = 0;
  for (const auto& t : file.tensors()) bytes += static_cast<std::int64_t>(t.num_bytes);
  return bytes;
}

Result<void> check_weights_fit(const gguf::GgufFile& file, const LlamaConfig& config,
                               std::int32_t world_size, std::int64_t memory_bytes,
                               std::int64_t beside_bytes) {
  std::int64_t weights = 0, experts = 0;
  for (const auto& t : file.tensors()) {
    weights += static_cast<std::int64_t>(t.num_bytes);
    if (is_expert_tensor(t.name)) experts += static_cast<std::int64_t>(t.num_bytes);
  }
  // A rank maps its share of the split matrices (the embedding and norms are whole on
  // each, a small part of a large model).
  const std::int64_t share = weights / std::max(world_size, 1);
  if (memory_bytes <= 0 || share + std::max<std::int64_t>(beside_bytes, 0) <= memory_bytes) {
    return {};
  }
  std::string what =
      "the model's weights take " + format_bytes(share) + (world_size > 1 ? " per rank" : "") +
      (beside_bytes > 0
           ? ", and with the " + format_bytes(beside_bytes) + " of the model beside them"
           : "") +
      ", more than this machine's " + format_bytes(memory_bytes) + " of memory";
  if (config.features.num_experts > 0) {
    what += " (its " + std::to_string(config.features.num_experts) + " experts a layer hold " +
            format_bytes(experts / std::max(world_size, 1)) +
            " of it: only a few are active per token, but all are read)";
  }
  return make_error(ErrorCode::out_of_range,
                    what +
                        ": mapped, it would be read from disk again at every step. Use a "
                        "smaller quantization (Q4_K_M, Q3_K_M, Q2_K) or split it over nodes "
                        "(--tensor-parallel-size with a cluster)");
}

std::string file_fingerprint(const gguf::GgufFile& file) {
  Fnv fnv;
  fnv.add_value(static_cast<std::uint64_t>(file.file_size()));
  for (const auto& [key, value] : file.metadata()) {
    fnv.add(key.data(), key.size());
    fnv.add_value(static_cast<int>(value.type));
  }
  for (const auto& t : file.tensors()) {
    fnv.add(t.name.data(), t.name.size());
    fnv.add_value(static_cast<int>(t.type));
    fnv.add(t.dims, sizeof(t.dims));
    fnv.add_value(t.offset);
    if (t.data != nullptr) fnv.add(t.data, std::min<std::uint64_t>(t.num_bytes, 64));
  }
  char text[40];
  std::snprintf(text, sizeof(text), "%zu-%016llx", file.file_size(),
                static_cast<unsigned long long>(fnv.h));
  return text;
}

LoadedModel& LoadedModel::operator=(LoadedModel&& other) noexcept {
  if (this == &other) return *this;
  model.reset();
  backend.reset();
  tokenizer.reset();  // it views the mapping
  path = std::move(other.path);
  file = std::move(other.file);
  tokenizer = std::move(other.tokenizer);
  config = std::move(other.config);
  chat_template = std::move(other.chat_template);
  backend = std::move(other.backend);
  model = std::move(other.model);
  kv_dtype = other.kv_dtype;
  group = std::move(other.group);
  pipe = std::move(other.pipe);
  return *this;
}

Result<LoadedModel> LoadedModel::open(const std::string& path) {
  LoadedModel m;
  m.path = path;
  TROUPE_TRY(auto file, gguf::GgufFile::open(path));
  m.file = std::make_unique<gguf::GgufFile>(std::move(file));
  TROUPE_TRY(auto tokenizer, text::Tokenizer::from_gguf(*m.file));
  m.tokenizer = std::make_unique<text::Tokenizer>(std::move(tokenizer));
  TROUPE_TRY(m.config, LlamaConfig::from_gguf(*m.file));
  if (m.config.vocab_size != static_cast<std::int32_t>(m.tokenizer->size())) {
    return make_error(ErrorCode::invalid_file,
                      path + ": the tokenizer has " + std::to_string(m.tokenizer->size()) +
                          " tokens but the embedding has " + std::to_string(m.config.vocab_size));
  }
  if (m.file->find("tokenizer.chat_template") != nullptr) {
    TROUPE_TRY(const auto chat_template, m.file->get_string("tokenizer.chat_template"));
    m.chat_template = std::string(chat_template);
  }
  return m;
}

Result<LoadedModel> LoadedModel::open(const std::string& path, std::unique_ptr<Backend> backend) {
  TROUPE_TRY(auto m, open(path));
  TROUPE_TRY_VOID(m.load_weights(std::move(backend)));
  return m;
}

Result<void> LoadedModel::load_weights(std::unique_ptr<Backend> on, const Shard& shard,
                                       const LoadProgress& progress) {
  backend = std::move(on);
  TROUPE_TRY(auto llama, LlamaModel::load(*file, *backend, shard, progress));
  model = std::make_unique<LlamaModel>(std::move(llama));
  return {};
}

KvCacheShape LoadedModel::kv_cache_shape(std::int32_t num_blocks, std::int32_t block_size) const {
  const LlamaConfig& c = model != nullptr ? model->local_config() : config;
  // A pipeline stage's cache holds its layers alone.
  const std::int32_t layers = model != nullptr ? model->num_stage_layers() : c.num_layers;
  return {layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, kv_dtype};
}

Result<void> LoadedModel::allocate_kv_cache(std::int32_t num_blocks, std::int32_t block_size) {
  return backend->allocate_kv_cache(kv_cache_shape(num_blocks, block_size));
}

}  // namespace troupe::model
