// The backend a worker runs on, for an engine's device settings: the CPU backend,
// or the CUDA backend where troupe was built with nvcc. Shared by the engine's
// worker factory and the commands that run a model without an engine.
#pragma once

#include <cstdint>
#include <memory>

#include "model/backend.hpp"
#include "model/llama_config.hpp"
#include "troupe/engine.hpp"

namespace troupe::actors {

// `max_model_len`: the longest sequence a recorded (CUDA graph) decode step serves.
Result<std::unique_ptr<model::Backend>> make_backend(const EngineConfig& config,
                                                     std::int32_t max_model_len);

// Whether the configured device can run a model of this shape (the CUDA kernels' limits).
Result<void> check_model(const EngineConfig& config, const model::LlamaConfig& model);

// KV blocks for a GPU's pool: config.gpu_memory_utilization of the memory it has free now
// (after the weights and buffers), each block of `shape` (its num_blocks ignored).
Result<std::int32_t> gpu_kv_blocks_that_fit(const EngineConfig& config, model::Backend& backend,
                                            const model::KvCacheShape& shape);

}  // namespace troupe::actors
