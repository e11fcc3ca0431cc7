// CudaBackend's ops, each a kernel launch (or a cuBLAS call) on the backend's stream, and
// sampling on the device.
#include <algorithm>
#include <cmath>
#include <string>

#include "gpu/cuda_backend_impl.hpp"

namespace troupe::gpu {

using gguf::TensorType;
using model::Tensor;
using model::Weight;

namespace {

cudaDataType_t cuda_type_of(TensorType type) {
  return type == TensorType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

}  // namespace

void CudaBackend::embed(const Weight& table, Tensor out) {
  wrote(out);
  kernels::embed(static_cast<const std::int32_t*>(impl_->tokens.data), table.data,
                 half_of(table.type), table.cols, out.data, out.rows, as_stream(stream_));
}

kernels::Copy16 CudaBackend::copy_for(Tensor out) {
  if (impl_->cast.bytes < out.rows * out.cols * 2) {
    cast_ = CastCopy{};
    return {};
  }
  cast_ = CastCopy{out.data, out.rows, out.cols, matmul_type_};
  return {impl_->cast.data, half_of(matmul_type_)};
}

void CudaBackend::rms_norm(Tensor x, const Weight& weight, float eps, Tensor out) {
  wrote(out);
  kernels::rms_norm(x.data, static_cast<const float*>(weight.data), eps, out.data, x.rows, x.cols,
                    copy_for(out), as_stream(stream_));
}

void CudaBackend::add_rms_norm(Tensor x, Tensor y, const Weight& weight, float eps, Tensor out) {
  wrote(x);
  wrote(out);
  kernels::add_rms_norm(x.data, y.data, static_cast<const float*>(weight.data), eps, out.data,
                        x.rows, x.cols, copy_for(out), as_stream(stream_));
}

void CudaBackend::matmul(Tensor x, const Weight& weight, Tensor out) {
  TROUPE_ASSERT(x.cols == weight.cols && out.cols == weight.rows && out.rows == x.rows,
                "matmul shapes disagree");
  TROUPE_ASSERT(weight.type == TensorType::f16 || weight.type == TensorType::bf16,
                "GPU matmul weights are F16 or BF16");
  if (x.rows == 0) return;
  TROUPE_ASSERT(impl_->cast.bytes >= x.rows * x.cols * 2, "matmul input larger than any tensor");
  matmul_type_ = weight.type;
  // Q, K and V (gate and up) read one normalized input: it is cast once, or written in 16 bits
  // by the norm that made it.
  if (cast_.source != x.data || cast_.rows != x.rows || cast_.cols != x.cols ||
      cast_.type != weight.type) {
    kernels::cast_to_16(x.data, impl_->cast.data, half_of(weight.type), x.rows * x.cols,
                        as_stream(stream_));
    cast_ = CastCopy{x.data, x.rows, x.cols, weight.type};
  }
  wrote(out);
  // Column-major view: out^T [w.rows, n] = W [w.rows, cols] (stored as W^T) * x^T [cols, n].
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t s =
      cublasGemmEx(impl_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(weight.rows),
                   static_cast<int>(x.rows), static_cast<int>(x.cols), &alpha, weight.data,
                   cuda_type_of(weight.type), static_cast<int>(weight.cols), impl_->cast.data,
                   cuda_type_of(weight.type), static_cast<int>(x.cols), &beta, out.data, CUDA_R_32F,
                   static_cast<int>(out.cols), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS && error_.empty()) {
    error_ = std::string("cuBLAS matmul: ") + cublas_name(s);
  }
}

namespace {

kernels::RopeArgs rope_args(std::int64_t cols, std::int32_t head_dim,
                            const model::RopeParams& params) {
  kernels::RopeArgs a;
  a.head_dim = head_dim;
  a.num_heads = static_cast<std::int32_t>(cols / head_dim);
  a.rot_dims = params.rot_dims;
  a.neox = params.layout == model::RopeLayout::neox;
  // The CPU backend's expression, so that both build the same angles.
  a.theta_scale = std::pow(params.freq_base, -2.0f / static_cast<float>(params.rot_dims));
  a.freq_scale = params.freq_scale;
  a.freq_factors = params.freq_factors != nullptr
                       ? static_cast<const float*>(params.freq_factors->data)
                       : nullptr;
  return a;
}

}  // namespace

void* CudaBackend::layer_cache(const Buffer& cache, std::int32_t layer) const {
  model::KvCacheShape one_layer = kv_shape_;
  one_layer.num_layers = 1;
  return static_cast<std::uint16_t*>(cache.data) + layer * kv_elements(one_layer);
}

void CudaBackend::rope(Tensor x, std::int32_t head_dim, const model::RopeParams& params) {
  wrote(x);
  kernels::rope_store_kv(
      x.data, nullptr, nullptr, static_cast<const std::int32_t*>(impl_->positions.data), nullptr,
      x.rows, rope_args(x.cols, head_dim, params), 0, nullptr, nullptr, as_stream(stream_));
}

void CudaBackend::rope_store_kv(std::int32_t layer, Tensor q, Tensor k, Tensor v,
                                std::int32_t head_dim, const model::RopeParams& params) {
  wrote(q);
  wrote(k);
  kernels::rope_store_kv(
      q.data, k.data, v.data, static_cast<const std::int32_t*>(impl_->positions.data),
      static_cast<const std::int32_t*>(impl_->slots.data), q.rows,
      rope_args(q.cols, head_dim, params), kv_shape_.num_kv_heads, layer_cache(k_cache_, layer),
      layer_cache(v_cache_, layer), as_stream(stream_));
}

void CudaBackend::store_kv(std::int32_t layer, Tensor k, Tensor v) {
  // The same kernel with no query and nothing to rotate.
  kernels::RopeArgs a;
  a.head_dim = kv_shape_.head_dim;
  kernels::rope_store_kv(
      nullptr, k.data, v.data, static_cast<const std::int32_t*>(impl_->positions.data),
      static_cast<const std::int32_t*>(impl_->slots.data), k.rows, a, kv_shape_.num_kv_heads,
      layer_cache(k_cache_, layer), layer_cache(v_cache_, layer), as_stream(stream_));
}

void CudaBackend::attention(std::int32_t layer, Tensor q, const model::AttentionParams& params,
                            Tensor out) {
  wrote(out);
  const auto& s = kv_shape_;
  if (!check_heads(params.num_heads, params.num_kv_heads, params.head_dim) ||
      params.head_dim != s.head_dim || params.num_kv_heads != s.num_kv_heads) {
    if (error_.empty()) error_ = "attention: heads do not fit the CUDA kernels";
    return;
  }
  num_heads_ = params.num_heads;
  kernels::AttentionArgs a;
  a.q = q.data;
  a.out = out.data;
  a.k_cache = layer_cache(k_cache_, layer);
  a.v_cache = layer_cache(v_cache_, layer);
  a.positions = static_cast<const std::int32_t*>(impl_->positions.data);
  a.token_seq = static_cast<const std::int32_t*>(impl_->token_seq.data);
  a.block_tables = static_cast<const std::int32_t*>(impl_->tables.data);
  a.block_stride = layout_.block_stride;
  a.block_size = s.block_size;
  a.num_heads = params.num_heads;
  a.num_kv_heads = params.num_kv_heads;
  a.head_dim = params.head_dim;
  a.scale = params.scale;
  a.softcap = params.softcap;
  a.window = params.window;
  // The output projection reads this next: its 16-bit input is written here.
  a.out16 = copy_for(out);
  a.partition = layout_.partition;
  const auto num_decode = static_cast<std::int32_t>(layout_.decode_rows.size());
  if (num_decode > 0) {
    // As many decode rows per launch as the reserved partials hold (all of a graph's).
    const std::int32_t chunk = decode_rows_per_launch(
        impl_->partials.bytes / 4, num_decode, params.num_heads, layout_.num_splits, s.head_dim);
    if (layout_.num_splits > 1 &&
        impl_->partials.bytes <
            4 * decode_partial_floats(1, params.num_heads, layout_.num_splits, s.head_dim)) {
      if (error_.empty()) error_ = "attention: decode scratch too small";
      return;
    }
    const auto* rows = static_cast<const std::int32_t*>(impl_->decode_rows.data);
    for (std::int32_t first = 0; first < num_decode; first += chunk) {
      kernels::paged_attention_decode(a, rows + first, std::min(chunk, num_decode - first),
                                      layout_.num_splits, static_cast<float*>(impl_->partials.data),
                                      as_stream(stream_));
    }
  }
  kernels::prefill_attention(a, static_cast<const kernels::PrefillTile*>(impl_->tiles.data),
                             static_cast<std::int32_t>(layout_.tiles.size()),
                             options_.prefill_tensor_cores, as_stream(stream_));
}

void CudaBackend::swiglu(Tensor gate, Tensor up, Tensor out) {
  wrote(out);
  kernels::swiglu(gate.data, up.data, out.data, gate.rows * gate.cols, copy_for(out),
                  as_stream(stream_));
}

void CudaBackend::add_bias(Tensor x, const Weight& bias) {
  TROUPE_ASSERT(bias.type == TensorType::f32 && bias.rows * bias.cols == x.cols,
                "add_bias: the bias does not fit the rows");
  wrote(x);
  kernels::add_bias(x.data, static_cast<const float*>(bias.data), x.rows, x.cols,
                    as_stream(stream_));
}

void CudaBackend::gelu_tanh_gate(Tensor gate, Tensor up, Tensor out) {
  wrote(out);
  kernels::gelu_tanh_gate(gate.data, up.data, out.data, gate.rows * gate.cols, copy_for(out),
                          as_stream(stream_));
}

void CudaBackend::scale(Tensor x, float factor) {
  wrote(x);
  kernels::scale(x.data, factor, x.rows * x.cols, as_stream(stream_));
}

void CudaBackend::softcap(Tensor x, float cap) {
  wrote(x);
  kernels::softcap(x.data, cap, x.rows * x.cols, as_stream(stream_));
}

void CudaBackend::add(Tensor x, Tensor y) {
  wrote(x);
  kernels::add(x.data, y.data, x.rows * x.cols, as_stream(stream_));
}

void CudaBackend::lora_add(Tensor x, std::span<const model::LoraGroup> groups, Tensor y) {
  if (groups.empty()) return;
  if (layout_.lora_slots.empty() || x.rows != y.rows || x.rows > layout_.rows) {
    if (error_.empty()) error_ = "lora_add: the step names no adapters for these rows";
    return;
  }
  wrote(y);
  // A group's slot is its rows' (a row is in one group at most); the launch takes up to
  // kLoraGroupsPerLaunch groups by value.
  kernels::LoraLaunch launch;
  launch.n_in = static_cast<std::int32_t>(x.cols);
  launch.n_out = static_cast<std::int32_t>(y.cols);
  launch.ax_stride = static_cast<std::int32_t>(std::max<std::int64_t>(1, max_lora_rank_));
  const auto flush = [&] {
    kernels::lora_add(x.data, y.data, x.rows,
                      static_cast<const std::int32_t*>(impl_->lora_slots.data), launch,
                      static_cast<float*>(impl_->lora_ax.data), as_stream(stream_));
    launch.num_groups = 0;
  };
  for (const auto& g : groups) {
    if (g.rows.empty()) continue;
    if (g.a.cols != x.cols || g.b_t.cols != y.cols || g.a.rows != g.b_t.rows ||
        g.a.rows > max_lora_rank_ || g.rows.back() >= x.rows) {
      if (error_.empty()) error_ = "lora_add: shapes disagree";
      return;
    }
    kernels::LoraGroupArgs& args = launch.groups[launch.num_groups++];
    args = {g.a.data,
            g.b_t.data,
            static_cast<std::int32_t>(g.a.rows),
            layout_.lora_slots[static_cast<std::size_t>(g.rows.front())],
            g.scale,
            g.a.type == gguf::TensorType::f16 ? 1 : 0};
    if (launch.num_groups == kernels::kLoraGroupsPerLaunch) flush();
  }
  if (launch.num_groups > 0) flush();
}

void CudaBackend::gather_logit_rows(Tensor x, Tensor out) {
  wrote(out);
  kernels::gather_rows(x.data, static_cast<const std::int32_t*>(impl_->logit_rows.data), out.data,
                       out.rows, x.cols, as_stream(stream_));
}

Result<void> CudaBackend::sample(Tensor logits, std::span<const model::DeviceSamplingRow> rows,
                                 std::span<TokenId> ids) {
  if (rows.size() != static_cast<std::size_t>(logits.rows) || ids.size() < rows.size()) {
    return make_error(ErrorCode::invalid_argument, "one sampling row and id per logit row");
  }
  if (rows.empty()) return {};
  auto& m = *impl_;
  const auto n = static_cast<std::int64_t>(rows.size());
  // Neither buffer is part of a graph: moving them needs nothing else.
  TROUPE_TRY_VOID(
      grow(m.sampling_params, n * static_cast<std::int64_t>(sizeof(kernels::SamplingRowArgs))));
  TROUPE_TRY_VOID(grow(m.sampled_ids, n * 4));
  auto& args = m.sampling_args;
  args.resize(rows.size());
  const auto words = static_cast<std::size_t>((logits.cols + 63) / 64);
  bool masked = false;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    args[i] = {r.temperature, r.top_k, r.top_p, r.min_p, r.seed, r.counter, r.allowed != nullptr};
    masked = masked || r.allowed != nullptr;
  }
  check(cudaMemcpyAsync(m.sampling_params.data, args.data(), args.size() * sizeof(args[0]),
                        cudaMemcpyHostToDevice, as_stream(stream_)),
        "sampling upload");
  if (masked) {
    // The grammars' bitmasks, one row of words per logit row (an unmasked row's unused).
    m.mask_words.assign(rows.size() * words, 0);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].allowed != nullptr) {
        std::copy(rows[i].allowed, rows[i].allowed + words, m.mask_words.begin() + i * words);
      }
    }
    TROUPE_TRY_VOID(grow(m.token_masks, static_cast<std::int64_t>(m.mask_words.size() * 8)));
    check(cudaMemcpyAsync(m.token_masks.data, m.mask_words.data(), m.mask_words.size() * 8,
                          cudaMemcpyHostToDevice, as_stream(stream_)),
          "grammar masks upload");
  }
  kernels::sample(logits.data, logits.rows, static_cast<std::int32_t>(logits.cols),
                  static_cast<const kernels::SamplingRowArgs*>(m.sampling_params.data),
                  masked ? static_cast<const std::uint64_t*>(m.token_masks.data) : nullptr,
                  static_cast<std::int32_t*>(m.sampled_ids.data), as_stream(stream_));
  auto& out = m.sampled;
  out.resize(rows.size());
  check(cudaMemcpyAsync(out.data(), m.sampled_ids.data, out.size() * 4, cudaMemcpyDeviceToHost,
                        as_stream(stream_)),
        "sampled ids");
  TROUPE_TRY_VOID(synchronize());
  std::copy(out.begin(), out.end(), ids.begin());
  return {};
}

}  // namespace troupe::gpu
