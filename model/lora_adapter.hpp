// A LoRA adapter in llama.cpp's GGUF layout (convert_lora_to_gguf.py): general.type
// "adapter", adapter.type "lora", adapter.lora.alpha, and for each adapted matrix
// blk.N.<w>.weight two tensors, .lora_a [n_in, rank] and .lora_b [rank, n_out] (ggml order).
// An adapted matrix computes y = W x + s B (A x), with s = scale * alpha / rank (alpha 0:
// s = scale), as llama.cpp's llm_build_lora_mm. Read once, checked against the base model
// it is for, and kept in F32 host memory; LlamaModel::attach_adapter puts it in a slot.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_file.hpp"
#include "gguf/tensor_type.hpp"
#include "model/llama_config.hpp"
#include "troupe/result.hpp"

namespace troupe::model {

// The matrices an adapter may adapt: a layer's separate attention and FFN projections.
enum class LoraTarget : std::uint8_t {
  attn_q,
  attn_k,
  attn_v,
  attn_output,
  ffn_gate,
  ffn_up,
  ffn_down,
};
inline constexpr std::size_t kNumLoraTargets = 7;

// "attn_q" ... "ffn_down": the matrix's name in blk.N.<name>.weight.
std::string_view lora_target_name(LoraTarget target);
// The target whose matrix is called `name` ("attn_q"), or nothing.
std::optional<LoraTarget> lora_target_of(std::string_view name);

// One adapted matrix W [n_out, n_in]: A [rank, n_in] row-major (ggml's lora_a as it is
// stored), B [n_out, rank] kept transposed (B^T [rank, n_out]: the layout whose columns are
// the vector lanes of cpu/kernels.hpp lora_expand, no horizontal sums), both in the file's
// type (F32 or F16; F32 where its two tensors differ), and its s.
struct LoraMatrix {
  std::int64_t n_in = 0, n_out = 0, rank = 0;
  float scale = 0.0f;  // s = scale * alpha / rank (alpha 0: scale)
  gguf::TensorType type = gguf::TensorType::f32;
  std::vector<std::byte> a;    // A: element k * n_in + i
  std::vector<std::byte> b_t;  // B^T: element k * n_out + j is B[j][k]
  // A[k][i] and B[j][k] as floats.
  float a_at(std::int64_t k, std::int64_t i) const;
  float b_at(std::int64_t j, std::int64_t k) const;
};

// The part of an adapted matrix W [n_out, n_in] a rank of a model split over ranks holds
// (model/tensor_parallel): W's rows [begin, +count), its outputs, so B's rows; or W's
// columns, its inputs, so A's columns (the ranks' partial updates then add up in the
// all-reduce that follows W's product); or all of it.
struct LoraCut {
  enum class Part : std::uint8_t { whole, outputs, inputs };
  Part part = Part::whole;
  std::int64_t begin = 0, count = 0;
};

class LoraAdapter {
 public:
  // Reads the adapter at `path` for the base model `base` (its file and config), at the
  // adapter's `scale` (1 as llama.cpp's default). Every tensor is checked: its name
  // (blk.N.<target>.weight.lora_a|b), its layer in range, its base matrix there, the
  // shapes against that matrix and each other, its type (F32 or F16); the error names the
  // tensor. A corrupt or truncated file is an error.
  static Result<LoraAdapter> open(const std::string& path, const gguf::GgufFile& base,
                                  const LlamaConfig& base_config, float scale = 1.0f);
  // The same over a file already open.
  static Result<LoraAdapter> read(const gguf::GgufFile& file, const gguf::GgufFile& base,
                                  const LlamaConfig& base_config, float scale = 1.0f);

  // A copy holding each target's cut of every layer's matrix (cuts[target]), for a rank.
  // An error where a cut falls outside a matrix.
  Result<LoraAdapter> cut(const std::array<LoraCut, kNumLoraTargets>& cuts) const;

  const std::string& architecture() const { return architecture_; }
  float alpha() const { return alpha_; }
  float scale() const { return scale_; }
  std::int32_t num_layers() const { return static_cast<std::int32_t>(layers_.size()); }
  // The adapted matrix of `layer`'s `target`, or null where the adapter leaves it alone.
  const LoraMatrix* find(std::int32_t layer, LoraTarget target) const;
  // How many matrices it adapts, and the largest rank among them.
  std::int32_t num_matrices() const { return num_matrices_; }
  std::int64_t max_rank() const { return max_rank_; }

 private:
  std::string architecture_;
  float alpha_ = 0.0f;
  float scale_ = 1.0f;
  std::int32_t num_matrices_ = 0;
  std::int64_t max_rank_ = 0;
  // [num_layers][target], null where not adapted.
  std::vector<std::array<std::unique_ptr<LoraMatrix>, kNumLoraTargets>> layers_;
};

}  // namespace troupe::model
