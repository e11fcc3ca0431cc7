// Loads ../shared's stories260K model and its golden llama.cpp outputs.
#pragma once

#include <memory>

#include "cpu/cpu_backend.hpp"
#include "model/loaded_model.hpp"
#include "support/batch_generator.hpp"
#include "support/mini_json.hpp"
#include "support/test_support.hpp"

namespace troupe::test {

// The model through the one loader, on a CPU backend, with a KV cache of kv_blocks.
struct LoadedTestModel : model::LoadedModel {
  static LoadedTestModel open(const std::string& path, std::int32_t kv_blocks,
                              std::int32_t block_size = 16, int threads = 2,
                              KvCacheDtype kv_dtype = KvCacheDtype::f16) {
    auto loaded = model::LoadedModel::open(path, std::make_unique<cpu::CpuBackend>(threads));
    if (!loaded) throw std::runtime_error(loaded.error().message);
    LoadedTestModel m;
    static_cast<model::LoadedModel&>(m) = std::move(*loaded);
    m.kv_dtype = kv_dtype;
    if (auto kv = m.allocate_kv_cache(kv_blocks, block_size); !kv) {
      throw std::runtime_error(kv.error().message);
    }
    return m;
  }
};

inline Json golden_cases() {
  return JsonParser(read_text(shared_file("golden/stories260K_greedy.json"))).parse();
}

// Greedy, 64 tokens, no stop at end-of-generation: how the golden outputs were made.
inline test::GenerationRequest golden_request(const Json& c) {
  test::GenerationRequest r;
  for (int id : c["prompt_ids"].ints()) r.prompt.push_back(id);
  r.params.temperature = 0.0f;
  r.params.max_tokens = 64;
  r.params.ignore_eos = true;
  return r;
}

}  // namespace troupe::test
