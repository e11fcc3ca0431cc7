#include "model/tensor_parallel.hpp"

namespace troupe::model {

Result<ShardLayout> shard_layout(const LlamaConfig& config, const Shard& shard) {
  const std::int32_t t = shard.world_size;
  if (t < 1 || shard.rank < 0 || shard.rank >= t) {
    return make_error(ErrorCode::invalid_argument,
                      "rank " + std::to_string(shard.rank) + " of a group of " + std::to_string(t));
  }
  auto refuse = [&](const std::string& what) {
    return make_error(ErrorCode::invalid_argument,
                      "the model cannot be split over " + std::to_string(t) + " ranks: " + what);
  };
  if (config.num_heads % t != 0) {
    return refuse(std::to_string(config.num_heads) + " attention heads");
  }
  const std::int32_t kv = config.num_kv_heads;
  if (kv % t != 0 && t % kv != 0) {
    return refuse(std::to_string(kv) + " KV heads (neither a multiple nor a divisor of the ranks)");
  }
  if (config.ffn_dim % t != 0) {
    return refuse("an FFN of " + std::to_string(config.ffn_dim));
  }
  ShardLayout layout;
  layout.num_heads = config.num_heads / t;
  layout.head_begin = shard.rank * layout.num_heads;
  if (kv >= t) {
    layout.num_kv_heads = kv / t;
    layout.kv_head_begin = shard.rank * layout.num_kv_heads;
  } else {
    // Ranks r with the same r / (t / kv) share one KV head: their query heads are all in
    // its group, since a group is (t / kv) ranks' worth of heads.
    layout.num_kv_heads = 1;
    layout.kv_head_begin = shard.rank / (t / kv);
  }
  layout.ffn_dim = config.ffn_dim / t;
  layout.ffn_begin = shard.rank * layout.ffn_dim;
  return layout;
}

LlamaConfig local_config(const LlamaConfig& config, const ShardLayout& layout) {
  LlamaConfig local = config;
  local.num_heads = layout.num_heads;
  local.num_kv_heads = layout.num_kv_heads;
  local.ffn_dim = layout.ffn_dim;
  return local;
}

Result<void> check_slice(const std::string& name, gguf::TensorType type, std::int64_t cols,
                         const WeightSlice& slice) {
  if (slice.axis == WeightSlice::Axis::rows) return {};
  const auto traits = gguf::tensor_type_traits(static_cast<std::uint32_t>(type));
  const auto block = static_cast<std::int64_t>(traits ? traits->block_elements : 1);
  if (slice.begin % block == 0 && slice.count % block == 0 && slice.begin + slice.count <= cols) {
    return {};
  }
  return make_error(ErrorCode::unsupported,
                    "tensor '" + name + "' (" + std::string(gguf::tensor_type_name(type)) +
                        ", blocks of " + std::to_string(block) + ") cannot be split at columns [" +
                        std::to_string(slice.begin) + ", " +
                        std::to_string(slice.begin + slice.count) +
                        "): a row-parallel split must fall on block boundaries; use fewer ranks "
                        "or a model quantized with smaller blocks");
}

}  // namespace troupe::model
