// How many KV blocks a worker's pool gets: the backend says how many bytes a block
// takes, the spec gives the budget, and the pool must hold one whole sequence.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/worker_protocol.hpp"
#include "troupe/result.hpp"

namespace troupe::worker {

// KV blocks that fit in `utilization` of `free_bytes` (what a device has free after
// the weights and buffers), each block taking `block_bytes`; at most `max_blocks`
// (0: no cap). 0 when nothing fits or an argument is not positive.
std::int64_t kv_blocks_for_memory(std::int64_t free_bytes, double utilization,
                                  std::int64_t block_bytes, std::int64_t max_blocks);

// A spec's KV budget in blocks of `block_bytes`: num_kv_blocks when set, else the bytes
// available (`free_bytes` scaled by gpu_memory_utilization on a GPU, else
// kv_cache_bytes). The pool must hold one whole sequence of max_model_len tokens; the
// error says a block's bytes, and `draft_block_bytes` of them a draft model's (0: none).
Result<std::int32_t> kv_blocks_for_budget(const engine::WorkerSpec& spec, std::int64_t block_bytes,
                                          std::optional<std::int64_t> free_bytes,
                                          std::int64_t draft_block_bytes = 0);

}  // namespace troupe::worker
