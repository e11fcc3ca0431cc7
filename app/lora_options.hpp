// vLLM's LoRA serving flags (issue 33): --lora-modules (name=path items, or vLLM's JSON
// form), --max-loras and --max-lora-rank. Its own file: serve adds them beside its others.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "net/http_server.hpp"
#include "troupe/engine.hpp"
#include "troupe/result.hpp"

namespace troupe::app {

struct LoraFlags {
  std::vector<std::string> modules;  // as given: name=path, or a JSON object
  // Adapters resident at once. Every adapter is resident (no swapping yet), so more
  // modules than this is refused. vLLM's default, 1.
  std::int32_t max_loras = 1;
  std::int32_t max_lora_rank = 16;  // vLLM's default
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter while serving; also on where
  // vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING is 1 or true.
  bool runtime_updating = false;
};

// Whether vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING value turns run-time updating on: "1"
// or "true" (any case, spaces around ignored), as vLLM reads it; null (unset) does not.
bool runtime_lora_env(const char* value);

void add_lora_options(CLI::App* cmd, LoraFlags& flags);

// One --lora-modules item: `name=path`, or vLLM's {"name": ..., "path": ...,
// "base_model_name": ...} (base_model_name, when given, must be the served model's name).
Result<net::ServerConfig::LoraModule> parse_lora_module(const std::string& item,
                                                        const std::string& base_name);

// Checks the flags and each adapter file (it exists, is a LoRA adapter GGUF, its rank is
// at most --max-lora-rank; the worker checks it against the model when it loads), then
// gives the names to the server and the paths to the engine, in the same order, and the
// slots (--max-loras) and run-time updating (the flag or VLLM_ALLOW_RUNTIME_LORA_UPDATING)
// to both. An error names the flag, the item and why.
Result<void> settle_lora(const LoraFlags& flags, net::ServerConfig& server, EngineConfig& engine);

}  // namespace troupe::app
