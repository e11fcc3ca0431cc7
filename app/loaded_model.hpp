// A model file opened for running on a device: the mapping, its tokenizer, the
// backend and the forward pass, kept together because each refers to the others.
#pragma once

#include <memory>
#include <string>

#include "model/gguf_file.hpp"
#include "model/llama_model.hpp"
#include "model/tokenizer.hpp"
#include "troupe/engine.hpp"

namespace troupe::app {

struct LoadedModel {
  std::string path;
  std::unique_ptr<model::GgufFile> file;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<model::Backend> backend;
  std::unique_ptr<model::LlamaModel> model;

  // path empty: the built-in model. `device`: the engine's device settings (device,
  // threads, graphs); `max_model_len`: the longest sequence a recorded step serves.
  static Result<LoadedModel> open(std::string path, const EngineConfig& device,
                                  std::int32_t max_model_len);
  Result<void> allocate_kv_cache(std::int32_t num_blocks, std::int32_t block_size);
};

}  // namespace troupe::app
