// Loads ../shared's stories260K model and its golden llama.cpp outputs.
#pragma once

#include <memory>

#include "cpu/cpu_backend.hpp"
#include "model/batch_generator.hpp"
#include "model/gguf_file.hpp"
#include "model/llama_model.hpp"
#include "model/tokenizer.hpp"
#include "support/mini_json.hpp"
#include "support/test_support.hpp"

namespace troupe::test {

struct LoadedTestModel {
  std::unique_ptr<model::GgufFile> file;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<cpu::CpuBackend> backend;
  std::unique_ptr<model::LlamaModel> model;

  static LoadedTestModel open(const std::string& path, std::int32_t kv_blocks,
                              std::int32_t block_size = 16, int threads = 2) {
    LoadedTestModel m;
    auto file = model::GgufFile::open(path);
    if (!file) throw std::runtime_error(file.error().message);
    m.file = std::make_unique<model::GgufFile>(std::move(*file));
    auto tokenizer = model::Tokenizer::from_gguf(*m.file);
    if (!tokenizer) throw std::runtime_error(tokenizer.error().message);
    m.tokenizer = std::make_unique<model::Tokenizer>(std::move(*tokenizer));
    m.backend = std::make_unique<cpu::CpuBackend>(threads);
    auto llama = model::LlamaModel::load(*m.file, *m.backend);
    if (!llama) throw std::runtime_error(llama.error().message);
    m.model = std::make_unique<model::LlamaModel>(std::move(*llama));
    const auto& c = m.model->config();
    auto kv = m.backend->allocate_kv_cache(
        model::KvCacheShape{c.num_layers, kv_blocks, block_size, c.num_kv_heads, c.head_dim});
    if (!kv) throw std::runtime_error(kv.error().message);
    return m;
  }
};

inline Json golden_cases() {
  return JsonParser(read_text(shared_file("golden/stories260K_greedy.json"))).parse();
}

// Greedy, 64 tokens, no stop at end-of-generation: how the golden outputs were made.
inline model::GenerationRequest golden_request(const Json& c) {
  model::GenerationRequest r;
  for (int id : c["prompt_ids"].ints()) r.prompt.push_back(id);
  r.params.temperature = 0.0f;
  r.params.max_tokens = 64;
  r.params.ignore_eos = true;
  return r;
}

}  // namespace troupe::test
