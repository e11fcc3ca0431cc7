#include "app/loaded_model.hpp"

#include "actors/backends.hpp"
#include "app/commands.hpp"

namespace troupe::app {

Result<LoadedModel> LoadedModel::open(std::string path, const EngineConfig& device,
                                      std::int32_t max_model_len) {
  if (path.empty()) {
    path = builtin_model_path();
    if (path.empty()) return make_error(ErrorCode::io, "the built-in model could not be written");
  }
  LoadedModel m;
  m.path = path;
  TROUPE_TRY(auto file, model::GgufFile::open(path));
  m.file = std::make_unique<model::GgufFile>(std::move(file));
  TROUPE_TRY(auto tokenizer, model::Tokenizer::from_gguf(*m.file));
  m.tokenizer = std::make_unique<model::Tokenizer>(std::move(tokenizer));
  TROUPE_TRY(m.backend, actors::make_backend(device, max_model_len));
  TROUPE_TRY(auto llama, model::LlamaModel::load(*m.file, *m.backend));
  TROUPE_TRY_VOID(actors::check_model(device, llama.config()));
  if (llama.config().vocab_size != static_cast<std::int32_t>(m.tokenizer->size())) {
    return make_error(ErrorCode::invalid_file, path + ": the tokenizer has " +
                                                   std::to_string(m.tokenizer->size()) +
                                                   " tokens but the embedding has " +
                                                   std::to_string(llama.config().vocab_size));
  }
  m.model = std::make_unique<model::LlamaModel>(std::move(llama));
  return m;
}

Result<void> LoadedModel::allocate_kv_cache(std::int32_t num_blocks, std::int32_t block_size) {
  const auto& c = model->config();
  return backend->allocate_kv_cache(
      model::KvCacheShape{c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim});
}

}  // namespace troupe::app
