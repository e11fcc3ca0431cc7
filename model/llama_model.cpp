// LlamaModel's weights and life: each tensor found in the GGUF file (or made by a
// WeightSource), checked for shape and type, cut to a rank's part, and uploaded to the
// backend; the bytes they take. The forward pass over them is llama_forward.cpp's.
#include "model/llama_model.hpp"

#include "gguf/dequantize.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

namespace troupe::model {

namespace {

class WeightLoader {
 public:
  WeightLoader(const gguf::GgufFile& file, Backend& backend) : file_(file), backend_(backend) {}

  // Loads `name`, a matrix of [rows, cols] in ggml's order (cols contiguous).
  Result<Weight> matrix(const std::string& name, std::int64_t rows, std::int64_t cols) {
    TROUPE_TRY(const gguf::GgufTensorInfo* info, find_matrix(name, rows, cols));
    return backend_.load_weight(*info);
  }

  // Loads a part of `name`: whole rows straight from the mapping, a range of columns
  // copied out of every row.
  Result<Weight> matrix_slice(const std::string& name, std::int64_t rows, std::int64_t cols,
                              const WeightSlice& slice) {
    TROUPE_TRY(const gguf::GgufTensorInfo* info, find_matrix(name, rows, cols));
    return slice_of(*info, name, rows, cols, slice);
  }

  // Loads expert `expert` of `name` [cols, rows, num_experts], or its part: the expert's
  // matrix is contiguous in the mapping.
  Result<Weight> expert(const std::string& name, std::int32_t expert, std::int32_t num_experts,
                        std::int64_t rows, std::int64_t cols, const WeightSlice* slice) {
    TROUPE_TRY(const gguf::GgufTensorInfo* info, find_tensor(name, {cols, rows, num_experts, 1}));
    const auto matrix_bytes = static_cast<std::int64_t>(gguf::row_bytes(info->type, cols)) * rows;
    gguf::GgufTensorInfo one = *info;
    one.num_dims = 2;
    one.dims[2] = 1;
    one.data = info->data + expert * matrix_bytes;
    one.num_bytes = static_cast<std::uint64_t>(matrix_bytes);
    if (slice == nullptr) return backend_.load_weight(one);
    return slice_of(one, name, rows, cols, *slice);
  }

 private:
  Result<Weight> slice_of(const gguf::GgufTensorInfo& whole, const std::string& name,
                          std::int64_t rows, std::int64_t cols, const WeightSlice& slice) {
    const gguf::GgufTensorInfo* info = &whole;
    TROUPE_TRY_VOID(check_slice(name, info->type, cols, slice));
    // Whole blocks (check_slice): byte offsets are the element counts' row sizes.
    const auto bytes_of = [type = info->type](std::int64_t elements) {
      return static_cast<std::int64_t>(gguf::row_bytes(type, elements));
    };
    const std::int64_t row_bytes = bytes_of(cols);
    gguf::GgufTensorInfo part = *info;
    if (slice.axis == WeightSlice::Axis::rows) {
      part.dims[1] = slice.count;
      part.data = info->data + slice.begin * row_bytes;
      part.num_bytes = static_cast<std::uint64_t>(slice.count * row_bytes);
      return backend_.load_weight(part);
    }
    const std::int64_t begin = bytes_of(slice.begin);
    const std::int64_t part_row_bytes = bytes_of(slice.count);
    auto bytes = std::make_unique<std::byte[]>(static_cast<std::size_t>(rows * part_row_bytes));
    for (std::int64_t r = 0; r < rows; ++r) {
      std::memcpy(bytes.get() + r * part_row_bytes, info->data + r * row_bytes + begin,
                  static_cast<std::size_t>(part_row_bytes));
    }
    part.dims[0] = slice.count;
    part.data = bytes.get();
    part.num_bytes = static_cast<std::uint64_t>(rows * part_row_bytes);
    auto weight = backend_.load_weight(part);
    owned_.push_back(std::move(bytes));
    return weight;
  }

 public:
  std::vector<std::unique_ptr<std::byte[]>> take_owned() { return std::move(owned_); }

 private:
  Result<const gguf::GgufTensorInfo*> find_matrix(const std::string& name, std::int64_t rows,
                                                  std::int64_t cols) {
    return find_tensor(name, {cols, rows, 1, 1});
  }

  // `name`, checked to have `dims` (ggml's order) and a type troupe computes with.
  Result<const gguf::GgufTensorInfo*> find_tensor(const std::string& name,
                                                  const std::array<std::int64_t, 4>& dims) {
    const gguf::GgufTensorInfo* info = file_.find_tensor(name);
    if (info == nullptr)
      return make_error(ErrorCode::invalid_file, "missing tensor '" + name + "'");
    if (info->dims[0] != dims[0] || info->dims[1] != dims[1] || info->dims[2] != dims[2] ||
        info->dims[3] != dims[3]) {
      const auto shape = [](auto d0, auto d1, auto d2) {
        return "[" + std::to_string(d0) + ", " + std::to_string(d1) +
               (d2 != 1 ? ", " + std::to_string(d2) : std::string()) + "]";
      };
      return make_error(ErrorCode::invalid_file,
                        "tensor '" + name + "' has shape " +
                            shape(info->dims[0], info->dims[1], info->dims[2]) + ", expected " +
                            shape(dims[0], dims[1], dims[2]));
    }
    if (!gguf::can_dequantize(info->type)) {
      return make_error(ErrorCode::unsupported,
                        "tensor '" + name + "' has type " +
                            std::string(gguf::tensor_type_name(info->type)) +
                            ", which troupe cannot compute with yet");
    }
    return info;
  }

 public:
  Result<Weight> vector(const std::string& name, std::int64_t size) {
    TROUPE_TRY(const gguf::GgufTensorInfo* info, find_vector(name, size));
    return backend_.load_weight(*info);
  }

  Result<Weight> vector_slice(const std::string& name, std::int64_t size, std::int64_t begin,
                              std::int64_t count) {
    TROUPE_TRY(const gguf::GgufTensorInfo* info, find_vector(name, size));
    TROUPE_ASSERT(begin >= 0 && count >= 0 && begin + count <= size, "vector slice out of range");
    gguf::GgufTensorInfo part = *info;
    part.num_dims = 1;
    part.dims[0] = count;
    part.dims[1] = part.dims[2] = part.dims[3] = 1;  // a slice of a stacked [size, experts] too
    part.data = info->data + begin * 4;
    part.num_bytes = static_cast<std::uint64_t>(count * 4);
    return backend_.load_weight(part);
  }

 private:
  // `name`, checked to be `size` F32 values.
  Result<const gguf::GgufTensorInfo*> find_vector(const std::string& name, std::int64_t size) {
    const gguf::GgufTensorInfo* info = file_.find_tensor(name);
    if (info == nullptr)
      return make_error(ErrorCode::invalid_file, "missing tensor '" + name + "'");
    if (info->type != gguf::TensorType::f32 || info->num_elements() != size) {
      return make_error(ErrorCode::invalid_file,
                        "tensor '" + name + "' must be " + std::to_string(size) + " F32 values");
    }
    return info;
  }

  const gguf::GgufFile& file_;
  Backend& backend_;
  std::vector<std::unique_ptr<std::byte[]>> owned_;
};

}  // namespace

LlamaModel::LlamaModel(LlamaModel&& other) noexcept
    : config_(std::move(other.config_)),
      local_(std::move(other.local_)),
      shard_(other.shard_),
      backend_(other.backend_),
      token_embedding_(other.token_embedding_),
      output_norm_(other.output_norm_),
      output_(other.output_),
      rope_freqs_(other.rope_freqs_),
      has_rope_freqs_(other.has_rope_freqs_),
      vocab_split_(other.vocab_split_),
      layers_(std::move(other.layers_)),
      owned_weights_(std::move(other.owned_weights_)),
      ws_(other.ws_),
      pipe_(std::move(other.pipe_)),
      pipe_buffer_(std::move(other.pipe_buffer_)),
      hop_seconds_(std::move(other.hop_seconds_)),
      adapters_(std::move(other.adapters_)),
      lora_weights_(std::move(other.lora_weights_)) {
  other.ws_ = Workspace{};
}

LlamaModel& LlamaModel::operator=(LlamaModel&& other) noexcept {
  if (this != &other) {
    release_workspace();
    for (auto& weights : lora_weights_) release_adapter_weights(weights);
    config_ = std::move(other.config_);
    local_ = std::move(other.local_);
    shard_ = other.shard_;
    backend_ = other.backend_;
    token_embedding_ = other.token_embedding_;
    output_norm_ = other.output_norm_;
    output_ = other.output_;
    rope_freqs_ = other.rope_freqs_;
    has_rope_freqs_ = other.has_rope_freqs_;
    vocab_split_ = other.vocab_split_;
    layers_ = std::move(other.layers_);
    owned_weights_ = std::move(other.owned_weights_);
    ws_ = other.ws_;
    other.ws_ = Workspace{};
    pipe_ = std::move(other.pipe_);
    pipe_buffer_ = std::move(other.pipe_buffer_);
    hop_seconds_ = std::move(other.hop_seconds_);
    adapters_ = std::move(other.adapters_);
    lora_weights_ = std::move(other.lora_weights_);
  }
  return *this;
}

LlamaModel::~LlamaModel() {
  release_workspace();
  for (auto& weights : lora_weights_) release_adapter_weights(weights);
}

Result<LlamaModel> LlamaModel::load(const gguf::GgufFile& file, Backend& backend,
                                    const Shard& shard, const LoadProgress& progress) {
  TROUPE_TRY(const auto config, LlamaConfig::from_gguf(file));
  WeightLoader loader(file, backend);
  WeightSource source;
  source.matrix = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
    return loader.matrix(name, rows, cols);
  };
  source.vector = [&](const std::string& name, std::int64_t size) {
    return loader.vector(name, size);
  };
  source.has = [&](const std::string& name) { return file.find_tensor(name) != nullptr; };
  source.matrix_slice = [&](const std::string& name, std::int64_t rows, std::int64_t cols,
                            const WeightSlice& slice) {
    return loader.matrix_slice(name, rows, cols, slice);
  };
  source.vector_slice = [&](const std::string& name, std::int64_t size, std::int64_t begin,
                            std::int64_t count) {
    return loader.vector_slice(name, size, begin, count);
  };
  source.expert = [&](const std::string& name, std::int32_t expert, std::int32_t num_experts,
                      std::int64_t rows, std::int64_t cols, const WeightSlice* slice) {
    return loader.expert(name, expert, num_experts, rows, cols, slice);
  };
  TROUPE_TRY(auto model, assemble(config, backend, source, shard, progress));
  model.owned_weights_ = loader.take_owned();
  return model;
}

namespace {

// The stage `asked` for, checked against the model; the whole model when not staged.
Result<PipelineStage> stage_of(const LlamaConfig& config, const Backend& backend,
                               const PipelineStage& asked) {
  if (!asked.is_staged()) return PipelineStage{0, 1, 0, config.num_layers};
  TROUPE_TRY_VOID(backend.supports_pipeline_stage());
  const PipelineStage& s = asked;
  const bool fits = s.index >= 0 && s.index < s.count && s.layer_begin >= 0 &&
                    s.layer_begin < s.layer_end && s.layer_end <= config.num_layers &&
                    (!s.is_first() || s.layer_begin == 0) &&
                    (!s.is_last() || s.layer_end == config.num_layers);
  if (!fits) {
    return make_error(
        ErrorCode::invalid_argument,
        "pipeline stage " + std::to_string(s.index) + " of " + std::to_string(s.count) +
            " with layers [" + std::to_string(s.layer_begin) + ", " + std::to_string(s.layer_end) +
            ") does not fit a model of " + std::to_string(config.num_layers) + " layers");
  }
  return s;
}

}  // namespace

Result<LlamaModel> LlamaModel::assemble(const LlamaConfig& config, Backend& backend,
                                        const WeightSource& source, const Shard& shard,
                                        const LoadProgress& progress) {
  TROUPE_TRY_VOID(backend.supports(config.features));
  TROUPE_TRY(const ShardLayout part, shard_layout(config, shard));
  if (shard.is_split() && !source.matrix_slice) {
    return make_error(ErrorCode::unsupported, "these weights cannot be split over ranks");
  }
  TROUPE_TRY(const PipelineStage stage, stage_of(config, backend, shard.stage));
  LlamaModel model(config, backend);
  model.shard_ = shard;
  model.shard_.stage = stage;
  model.local_ = model::local_config(config, part);
  const auto& c = model.config_;
  const std::int64_t hd = c.head_dim;
  const std::int64_t q_dim = static_cast<std::int64_t>(c.num_heads) * hd;
  const std::int64_t kv_dim = static_cast<std::int64_t>(c.num_kv_heads) * hd;
  using Axis = WeightSlice::Axis;
  // The whole matrix on one rank; the rank's part of it in a group.
  auto matrix = [&](const std::string& name, std::int64_t rows, std::int64_t cols, Axis axis,
                    std::int64_t begin, std::int64_t count) -> Result<Weight> {
    if (!shard.is_split()) return source.matrix(name, rows, cols);
    return source.matrix_slice(name, rows, cols, WeightSlice{axis, begin, count});
  };
  // The embedding on the first stage, the output norm and head on the last.
  if (stage.is_first()) {
    TROUPE_TRY(model.token_embedding_, source.matrix("token_embd.weight", c.vocab_size, c.dim));
  }
  if (stage.is_last()) {
    TROUPE_TRY(model.output_norm_, source.vector("output_norm.weight", c.dim));
  }
  const bool tied = !source.has("output.weight");
  // The LM head split by vocabulary when it divides: each rank its rows, rank 0 gathers
  // the logits. Else rank 0 alone holds it.
  model.vocab_split_ = stage.is_last() && shard.is_split() && c.vocab_size % shard.world_size == 0;
  if (model.vocab_split_) {
    const std::int64_t part = c.vocab_size / shard.world_size;
    TROUPE_TRY(model.output_,
               source.matrix_slice(tied ? "token_embd.weight" : "output.weight", c.vocab_size,
                                   c.dim, WeightSlice{Axis::rows, shard.rank * part, part}));
  } else if (!shard.computes_logits()) {
    model.output_ = Weight{};
  } else if (!tied) {
    TROUPE_TRY(model.output_, source.matrix("output.weight", c.vocab_size, c.dim));
  } else if (stage.is_first()) {
    model.output_ = model.token_embedding_;  // tied embeddings
  } else {                                   // tied, on a last stage that holds no embedding
    TROUPE_TRY(model.output_, source.matrix("token_embd.weight", c.vocab_size, c.dim));
  }
  if (source.has("rope_freqs.weight")) {
    TROUPE_TRY(model.rope_freqs_, source.vector("rope_freqs.weight", c.rope_dims / 2));
    model.has_rope_freqs_ = true;
  }
  const std::int64_t q_begin = part.head_begin * hd, q_count = part.num_heads * hd;
  const std::int64_t kv_begin = part.kv_head_begin * hd, kv_count = part.num_kv_heads * hd;
  const ArchFeatures& f = c.features;
  if ((f.fused_qkv || f.fused_gate_up) && !source.matrix_slice) {
    return make_error(ErrorCode::unsupported, "these weights cannot be cut into fused parts");
  }
  if (f.qk_norm_whole && shard.is_split()) {
    // Each rank holds some heads; their norm would need every rank's sum of squares.
    return make_error(ErrorCode::unsupported,
                      c.architecture +
                          " split over ranks: its Q/K norms span every head (one "
                          "rank per replica for now)");
  }
  if ((f.qkv_bias || f.attention_sinks || f.moe_biases) && shard.is_split() &&
      !source.vector_slice) {
    return make_error(ErrorCode::unsupported, "these biases cannot be split over ranks");
  }
  // A part of a fused tensor: rows [begin, begin + count) of `name`.
  auto rows_of = [&](const std::string& name, std::int64_t rows, std::int64_t cols,
                     std::int64_t begin, std::int64_t count) {
    return source.matrix_slice(name, rows, cols, WeightSlice{Axis::rows, begin, count});
  };
  auto bias = [&](const std::string& name, std::int64_t size, std::int64_t begin,
                  std::int64_t count) -> Result<Weight> {
    if (!shard.is_split()) return source.vector(name, size);
    return source.vector_slice(name, size, begin, count);
  };
  model.layers_.reserve(static_cast<std::size_t>(stage.layer_end - stage.layer_begin));
  for (std::int32_t i = stage.layer_begin; i < stage.layer_end; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights l;
    TROUPE_TRY(l.attn_norm, source.vector(b + "attn_norm.weight", c.dim));
    if (f.fused_qkv) {
      // attn_qkv's rows: Q [0, q_dim), K [q_dim, +kv_dim), V [q_dim + kv_dim, +kv_dim).
      const std::string name = b + "attn_qkv.weight";
      const std::int64_t rows = q_dim + 2 * kv_dim;
      TROUPE_TRY(l.wq, rows_of(name, rows, c.dim, q_begin, q_count));
      TROUPE_TRY(l.wk, rows_of(name, rows, c.dim, q_dim + kv_begin, kv_count));
      TROUPE_TRY(l.wv, rows_of(name, rows, c.dim, q_dim + kv_dim + kv_begin, kv_count));
    } else {
      TROUPE_TRY(l.wq, matrix(b + "attn_q.weight", q_dim, c.dim, Axis::rows, q_begin, q_count));
      TROUPE_TRY(l.wk, matrix(b + "attn_k.weight", kv_dim, c.dim, Axis::rows, kv_begin, kv_count));
      TROUPE_TRY(l.wv, matrix(b + "attn_v.weight", kv_dim, c.dim, Axis::rows, kv_begin, kv_count));
    }
    if (f.qkv_bias) {
      TROUPE_TRY(l.bq, bias(b + "attn_q.bias", q_dim, q_begin, q_count));
      TROUPE_TRY(l.bk, bias(b + "attn_k.bias", kv_dim, kv_begin, kv_count));
      TROUPE_TRY(l.bv, bias(b + "attn_v.bias", kv_dim, kv_begin, kv_count));
    }
    if (f.qk_norm) {  // one weight for every head: each rank holds it whole
      TROUPE_TRY(l.q_norm, source.vector(b + "attn_q_norm.weight", hd));
      TROUPE_TRY(l.k_norm, source.vector(b + "attn_k_norm.weight", hd));
    } else if (f.qk_norm_whole) {
      TROUPE_TRY(l.q_norm, source.vector(b + "attn_q_norm.weight", q_dim));
      TROUPE_TRY(l.k_norm, source.vector(b + "attn_k_norm.weight", kv_dim));
    }
    TROUPE_TRY(l.wo, matrix(b + "attn_output.weight", c.dim, q_dim, Axis::cols, q_begin, q_count));
    if (f.attn_output_bias) {  // added after the all-reduce: every rank holds it whole
      TROUPE_TRY(l.bo, source.vector(b + "attn_output.bias", c.dim));
    }
    if (f.attention_sinks) {
      TROUPE_TRY(l.sinks,
                 bias(b + "attn_sinks.weight", c.num_heads, part.head_begin, part.num_heads));
    }
    TROUPE_TRY(l.ffn_norm,
               source.vector(b + (f.ffn_norm_named_post_attention ? "post_attention_norm.weight"
                                                                  : "ffn_norm.weight"),
                             c.dim));
    if (f.num_experts > 0) {
      TROUPE_TRY(l.moe, load_experts(c, source, i, part.ffn_begin, part.ffn_dim, shard));
    } else if (f.fused_gate_up) {
      // ffn_up's rows: the gate [0, ffn_dim), then up [ffn_dim, 2 ffn_dim).
      const std::string name = b + "ffn_up.weight";
      TROUPE_TRY(l.w_gate, rows_of(name, 2 * c.ffn_dim, c.dim, part.ffn_begin, part.ffn_dim));
      TROUPE_TRY(l.w_up, rows_of(name, 2 * c.ffn_dim, c.dim,
                                 std::int64_t{c.ffn_dim} + part.ffn_begin, part.ffn_dim));
    } else {
      TROUPE_TRY(l.w_gate, matrix(b + "ffn_gate.weight", c.ffn_dim, c.dim, Axis::rows,
                                  part.ffn_begin, part.ffn_dim));
      TROUPE_TRY(l.w_up, matrix(b + "ffn_up.weight", c.ffn_dim, c.dim, Axis::rows, part.ffn_begin,
                                part.ffn_dim));
    }
    if (f.num_experts == 0) {
      TROUPE_TRY(l.w_down, matrix(b + "ffn_down.weight", c.dim, c.ffn_dim, Axis::cols,
                                  part.ffn_begin, part.ffn_dim));
    }
    if (f.post_norms) {
      TROUPE_TRY(l.post_attn_norm, source.vector(b + "post_attention_norm.weight", c.dim));
      TROUPE_TRY(l.post_ffn_norm, source.vector(b + "post_ffw_norm.weight", c.dim));
    }
    model.layers_.push_back(l);
    if (progress) progress(i + 1 - stage.layer_begin, stage.layer_end - stage.layer_begin);
  }
  return model;
}

Result<MoeLayer> LlamaModel::load_experts(const LlamaConfig& c, const WeightSource& source,
                                          std::int32_t layer, std::int64_t ffn_begin,
                                          std::int64_t ffn_count, const Shard& shard) {
  const bool split = shard.is_split();
  const ArchFeatures& f = c.features;
  const std::string b = "blk." + std::to_string(layer) + ".";
  const std::int32_t num = f.num_experts;
  MoeLayer moe;
  moe.num_used = f.num_experts_used;
  moe.routing = f.routing;
  moe.activation = f.expert_activation;
  // Every rank routes every token: it holds the whole router.
  TROUPE_TRY(moe.router, source.matrix(b + "ffn_gate_inp.weight", num, c.dim));
  if (f.moe_biases) {
    TROUPE_TRY(moe.router_bias, source.vector(b + "ffn_gate_inp.bias", num));
  }
  // Split over ranks, each rank holds its slice of every expert (rows of gate and up,
  // columns of down), as a dense FFN is split: one all-reduce after the layer, and every
  // rank as busy as the others whatever the routing.
  const WeightSlice rows{WeightSlice::Axis::rows, ffn_begin, ffn_count};
  const WeightSlice cols{WeightSlice::Axis::cols, ffn_begin, ffn_count};
  const bool stacked =
      source.has(b + "ffn_gate_exps.weight") || !source.has(b + "ffn_gate.0.weight");
  if (stacked && !source.expert) {
    return make_error(ErrorCode::unsupported, "these weights hold no stacked experts");
  }
  auto bias = [&](const std::string& name, std::int64_t size, std::int64_t begin,
                  std::int64_t count) -> Result<Weight> {
    if (!split) return source.vector_slice(name, size * num, begin, size);
    return source.vector_slice(name, size * num, begin + ffn_begin, count);
  };
  moe.experts.resize(static_cast<std::size_t>(num));
  for (std::int32_t e = 0; e < num; ++e) {
    ExpertWeights& x = moe.experts[static_cast<std::size_t>(e)];
    if (stacked) {
      TROUPE_TRY(x.gate, source.expert(b + "ffn_gate_exps.weight", e, num, c.ffn_dim, c.dim,
                                       split ? &rows : nullptr));
      TROUPE_TRY(x.up, source.expert(b + "ffn_up_exps.weight", e, num, c.ffn_dim, c.dim,
                                     split ? &rows : nullptr));
      TROUPE_TRY(x.down, source.expert(b + "ffn_down_exps.weight", e, num, c.dim, c.ffn_dim,
                                       split ? &cols : nullptr));
    } else {  // one tensor per expert (older Mixtral files)
      const std::string n = "." + std::to_string(e) + ".weight";
      auto one = [&](const std::string& name, std::int64_t r, std::int64_t k,
                     const WeightSlice& part) -> Result<Weight> {
        if (!split) return source.matrix(name, r, k);
        return source.matrix_slice(name, r, k, part);
      };
      TROUPE_TRY(x.gate, one(b + "ffn_gate" + n, c.ffn_dim, c.dim, rows));
      TROUPE_TRY(x.up, one(b + "ffn_up" + n, c.ffn_dim, c.dim, rows));
      TROUPE_TRY(x.down, one(b + "ffn_down" + n, c.dim, c.ffn_dim, cols));
    }
    if (f.moe_biases) {  // [ffn, num] and [dim, num]: expert e's values at e * size
      if (split && !source.vector_slice) {
        return make_error(ErrorCode::unsupported, "these biases cannot be split over ranks");
      }
      TROUPE_TRY(x.gate_bias,
                 bias(b + "ffn_gate_exps.bias", c.ffn_dim, std::int64_t{e} * c.ffn_dim, ffn_count));
      TROUPE_TRY(x.up_bias,
                 bias(b + "ffn_up_exps.bias", c.ffn_dim, std::int64_t{e} * c.ffn_dim, ffn_count));
      // The down bias is added once, by rank 0: the other ranks' partial sums have none.
      if (shard.rank == 0) {
        TROUPE_TRY(x.down_bias,
                   source.vector_slice(b + "ffn_down_exps.bias", std::int64_t{c.dim} * num,
                                       std::int64_t{e} * c.dim, c.dim));
      }
    }
  }
  return moe;
}

std::int64_t LlamaModel::weight_bytes() const {
  std::int64_t total = 0;
  const auto add = [&](const Weight& w) {
    if (w.data != nullptr) {
      total += w.rows * static_cast<std::int64_t>(gguf::row_bytes(w.type, w.cols));
    }
  };
  add(token_embedding_);
  add(output_norm_);
  // A tied output is the embedding, or (a rank's vocabulary slice) a part of it.
  const auto embedding = reinterpret_cast<std::uintptr_t>(token_embedding_.data);
  const auto output = reinterpret_cast<std::uintptr_t>(output_.data);
  const std::int64_t embedding_bytes =
      token_embedding_.rows *
      static_cast<std::int64_t>(gguf::row_bytes(token_embedding_.type, token_embedding_.cols));
  const bool tied = embedding != 0 && output >= embedding &&
                    output < embedding + static_cast<std::uintptr_t>(embedding_bytes);
  if (!tied) add(output_);
  if (has_rope_freqs_) add(rope_freqs_);
  for (const LayerWeights& l : layers_) {
    for (const Weight* w : {&l.attn_norm,
                            &l.wq,
                            &l.wk,
                            &l.wv,
                            &l.wo,
                            &l.bq,
                            &l.bk,
                            &l.bv,
                            &l.q_norm,
                            &l.k_norm,
                            &l.bo,
                            &l.sinks,
                            &l.post_attn_norm,
                            &l.ffn_norm,
                            &l.w_gate,
                            &l.w_up,
                            &l.w_down,
                            &l.post_ffn_norm,
                            &l.moe.router,
                            &l.moe.router_bias}) {
      add(*w);
    }
    for (const ExpertWeights& e : l.moe.experts) {
      for (const Weight* w : {&e.gate, &e.up, &e.down, &e.gate_bias, &e.up_bias, &e.down_bias}) {
        add(*w);
      }
    }
  }
  return total;
}

}  // namespace troupe::model
