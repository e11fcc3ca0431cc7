// --speculative-config '<json>' (vLLM's flag): speculative decoding for serve, generate
// and the benchmarks: the n-gram (prompt lookup) proposer or a draft model.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "troupe/engine.hpp"
#include "troupe/result.hpp"

namespace troupe::app {

// Reads vLLM's JSON: {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max":
// n, "prompt_lookup_min": m, "disable_by_batch_size": b}, or {"model": "draft.gguf",
// "num_speculative_tokens": k, "method": "draft_model" (optional), "disable_by_batch_size":
// b}. As vLLM: with neither lookup bound both are 5, with one the other is the same; k is
// required. An error names the field (or says the JSON does not parse).
Result<SpeculativeConfig> parse_speculative_config(const std::string& json);

// Adds --speculative-config to `cmd`; a bad value is a CLI::ValidationError.
void add_speculative_option(CLI::App* cmd, EngineConfig& engine);

}  // namespace troupe::app
