// vLLM's run-time LoRA routes (issue 33): POST /v1/load_lora_adapter {"lora_name",
// "lora_path"} and POST /v1/unload_lora_adapter {"lora_name"}. A load checks the name (new:
// not the model's, not an adapter's) and the file as --lora-modules does (a LoRA adapter
// GGUF of rank at most --max-lora-rank), has the engine read it on every worker into a
// free slot, then names it: requests may use it, /v1/models lists it, the metrics label
// it. An unload takes the name away at once (a request naming it is a 404); requests
// running with it finish, and its slot is free for a later load after them.
#pragma once

#include <string>
#include <string_view>

#include "net/api_error.hpp"
#include "net/http_server.hpp"
#include "net/openai_api.hpp"
#include "troupe/engine.hpp"

namespace troupe::net {

struct LoraAdmin {
  Engine& engine;
  const ServerConfig& config;
  const ApiContext& context;  // its LoRA table is what changes

  // vLLM's answers: "Success: LoRA adapter 'N' added successfully." (and "removed");
  // errors are 400s, but for an unload of an unknown name (404), and all of them while
  // run-time updating is off (saying how to turn it on).
  tl::expected<std::string, ApiError> load(std::string_view body) const;
  tl::expected<std::string, ApiError> unload(std::string_view body) const;
};

}  // namespace troupe::net
