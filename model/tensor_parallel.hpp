// Tensor parallelism (Megatron-style): how one rank's share of a Llama model is cut.
// Q, K, V, gate and up are split by output rows (each rank its heads and its slice of the
// FFN); the attention output and the down projection by input columns, so that each rank's
// product is a partial sum the group adds up (Backend::all_reduce). Embedding and norms
// stay whole on every rank. The LM head is split by vocabulary when the ranks divide it
// (each rank its rows; rank 0 gathers the logits: Backend::gather_columns), else held
// by rank 0 alone; only rank 0 samples.
#pragma once

#include <cstdint>
#include <string>

#include "gguf/tensor_type.hpp"
#include "model/llama_config.hpp"
#include "model/pipeline_parallel.hpp"
#include "troupe/result.hpp"

namespace troupe::model {

// A worker's part of a model: its rank of a tensor-parallel group, and its pipeline stage
// (model/pipeline_parallel.hpp). Only rank 0 of the last stage computes logits and samples.
struct Shard {
  std::int32_t rank = 0;
  std::int32_t world_size = 1;
  PipelineStage stage = {};

  bool is_split() const { return world_size > 1; }
  bool is_staged() const { return stage.is_staged(); }
  bool computes_logits() const { return rank == 0 && stage.is_last(); }
};

// The heads and FFN columns one rank holds. When the model has fewer KV heads than there
// are ranks, each KV head is held by world_size / num_kv_heads ranks (as vLLM does).
struct ShardLayout {
  std::int32_t head_begin = 0;  // this rank's query heads: [head_begin, +num_heads)
  std::int32_t num_heads = 0;
  std::int32_t kv_head_begin = 0;  // its KV heads: [kv_head_begin, +num_kv_heads)
  std::int32_t num_kv_heads = 0;
  std::int32_t ffn_begin = 0;  // its FFN columns: [ffn_begin, +ffn_dim)
  std::int32_t ffn_dim = 0;
};

// The layout of `shard`, or why the model cannot be split that way (heads or FFN that do
// not divide among the ranks).
Result<ShardLayout> shard_layout(const LlamaConfig& config, const Shard& shard);

// The config a rank computes with: its heads, its KV heads and its slice of the FFN.
LlamaConfig local_config(const LlamaConfig& config, const ShardLayout& layout);

// A part of a weight matrix [rows, cols]: whole rows, or a range of columns in every row.
struct WeightSlice {
  enum class Axis { rows, cols };
  Axis axis = Axis::rows;
  std::int64_t begin = 0;
  std::int64_t count = 0;
};

// Whether a tensor of `type` can be cut at `slice`: a column range must fall on the
// type's block boundaries. The error names the tensor.
Result<void> check_slice(const std::string& name, gguf::TensorType type, std::int64_t cols,
                         const WeightSlice& slice);

}  // namespace troupe::model
