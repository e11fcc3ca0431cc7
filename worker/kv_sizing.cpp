#include "worker/kv_sizing.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace troupe::worker {

std::int64_t kv_blocks_for_memory(std::int64_t free_bytes, double utilization,
                                  std::int64_t block_bytes, std::int64_t max_blocks) {
  if (free_bytes <= 0 || block_bytes <= 0 || !(utilization > 0.0)) return 0;
  const double budget = static_cast<double>(free_bytes) * std::min(utilization, 1.0);
  const auto blocks =
      static_cast<std::int64_t>(std::floor(budget / static_cast<double>(block_bytes)));
  return max_blocks > 0 ? std::min(blocks, max_blocks) : blocks;
}

Result<std::int32_t> kv_blocks_for_budget(const engine::WorkerSpec& spec, std::int64_t block_bytes,
                                          std::optional<std::int64_t> free_bytes,
                                          std::int64_t draft_block_bytes) {
  constexpr std::int64_t kMaxBlocks = std::int64_t{1} << 30;
  std::int64_t blocks = spec.num_kv_blocks;
  if (blocks <= 0 && free_bytes) {
    if (!(spec.gpu_memory_utilization > 0.0 && spec.gpu_memory_utilization <= 1.0)) {
      return make_error(ErrorCode::invalid_argument, "gpu_memory_utilization must be in (0, 1]");
    }
    blocks =
        kv_blocks_for_memory(*free_bytes, spec.gpu_memory_utilization, block_bytes, kMaxBlocks);
    if (blocks <= 0) {
      return make_error(ErrorCode::out_of_range,
                        "no GPU memory is left for the KV cache after the weights (" +
                            std::to_string(*free_bytes) + " bytes free)");
    }
  } else if (blocks <= 0 && block_bytes > 0) {
    blocks = spec.kv_cache_bytes / block_bytes;
  }
  const std::int64_t needed = (spec.max_model_len + spec.block_size - 1) / spec.block_size;
  if (blocks < needed) {
    return make_error(ErrorCode::out_of_range,
                      "the KV cache of " + std::to_string(blocks) + " blocks of " +
                          std::to_string(spec.block_size) + " tokens (" +
                          std::to_string(block_bytes) + " bytes a block" +
                          (draft_block_bytes > 0 ? ", " + std::to_string(draft_block_bytes) +
                                                       " of them the draft model's"
                                                 : std::string()) +
                          ") cannot hold one sequence of " + std::to_string(spec.max_model_len) +
                          " tokens: give it more memory or lower max_model_len");
  }
  return static_cast<std::int32_t>(std::min(blocks, kMaxBlocks));
}

}  // namespace troupe::worker
