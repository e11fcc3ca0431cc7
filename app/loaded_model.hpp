// A model file opened for running on the CPU: the mapping, its tokenizer, the
// backend and the forward pass, kept together because each refers to the others.
#pragma once

#include <memory>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "model/gguf_file.hpp"
#include "model/llama_model.hpp"
#include "model/tokenizer.hpp"

namespace troupe::app {

struct LoadedModel {
  std::string path;
  std::unique_ptr<model::GgufFile> file;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::unique_ptr<cpu::CpuBackend> backend;
  std::unique_ptr<model::LlamaModel> model;

  // path empty: the built-in model. kv_blocks: blocks of `block_size` tokens.
  static Result<LoadedModel> open(std::string path, int num_threads);
  Result<void> allocate_kv_cache(std::int32_t num_blocks, std::int32_t block_size);
};

}  // namespace troupe::app
