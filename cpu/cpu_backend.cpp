#include "cpu/cpu_backend.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include <sys/mman.h>
#include <unistd.h>

#include "cpu/attention.hpp"
#include "cpu/float_panels.hpp"
#include "cpu/kernels.hpp"
#include "cpu/row_ops.hpp"
#include "gguf/dequantize.hpp"
#include "gguf/half.hpp"
#include "model/llama_config.hpp"

namespace troupe::cpu {

using gguf::TensorType;
using model::Tensor;
using model::Weight;

namespace {

float* row(Tensor t, std::int64_t r) {
  return t.data + r * t.cols;
}

// F32, F16 and BF16 have float kernels; the blocks of 32 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL, MXFP4), the K-quants and IQ4_XS int8 ones (int8_matmul.hpp): every type a model may
// hold (gguf::can_dequantize), its rows whole blocks.
bool has_float_kernel(TensorType type) {
  return type == TensorType::f32 || type == TensorType::f16 || type == TensorType::bf16;
}

}  // namespace

CpuBackend::CpuBackend(int num_threads)
    : CpuBackend(std::make_shared<ThreadPool>(
          num_threads > 0 ? num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency())))) {}

CpuBackend::CpuBackend(std::shared_ptr<ThreadPool> pool)
    : pool_holder_(std::move(pool)), pool_(*pool_holder_) {}

CpuBackend::~CpuBackend() = default;

namespace {

// Asks the kernel to reclaim the whole pages of [data, data + bytes) now (MADV_PAGEOUT,
// Linux 5.4 on; elsewhere nothing). A repacked weight's own pages are not read again, so its
// copy does not double the weights' memory. Safe on any memory: a file's pages are read
// again if something touches them, anonymous ones go to swap or stay.
void release_pages(const void* data, std::size_t bytes) {
#ifdef MADV_PAGEOUT
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t begin = (start + page - 1) / page * page;
  const std::uintptr_t end = (start + bytes) / page * page;
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace

std::string CpuBackend::describe() const {
  return "CPU, " + std::to_string(num_threads()) + " threads, SIMD " + simd_target_name() +
         ", int8 " + std::string(int8_path_name(best_int8_path()));
}

Result<Weight> CpuBackend::load_weight(const gguf::GgufTensorInfo& info) {
  const Weight weight{info.data, info.type, info.dims[1] * info.dims[2] * info.dims[3],
                      info.dims[0]};
  // A matrix the repacked kernel takes is repacked on its first product (an embedding table
  // that is only looked up never is). A weight loaded where another was replaces it.
  if (weight.rows > 1 &&
      (has_float_panels(weight.type) ||
       (can_repack(weight.type, weight.cols) && repacked_kernel_available(weight.type)))) {
    Packing packing;
    // A tied output head is the token table: its rows are still looked up.
    packing.looked_up = info.name.ends_with("token_embd.weight");
    repacked_.insert_or_assign(weight.data, std::move(packing));
  } else {
    repacked_.erase(weight.data);
  }
  return weight;
}

Result<Tensor> CpuBackend::allocate(std::int64_t rows, std::int64_t cols) {
  const auto bytes = static_cast<std::size_t>(rows * cols) * sizeof(float);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    return make_error(ErrorCode::out_of_range, "out of memory for a " + std::to_string(rows) +
                                                   " x " + std::to_string(cols) +
                                                   " activation buffer");
  }
  return Tensor{static_cast<float*>(p), rows, cols};
}

void CpuBackend::release(Tensor tensor) {
  std::free(tensor.data);
}

Result<void> CpuBackend::allocate_kv_cache(const model::KvCacheShape& shape) {
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return make_error(ErrorCode::invalid_argument, "KV cache dimensions must be positive");
  }
  const std::size_t bytes = static_cast<std::size_t>(shape.num_layers) * shape.num_blocks *
                            shape.num_kv_heads * shape.block_size * shape.head_dim *
                            model::kv_element_bytes(shape.dtype);
  try {
    k_cache_.assign(bytes, std::byte{0});
    v_cache_.assign(bytes, std::byte{0});
  } catch (const std::bad_alloc&) {
    k_cache_.clear();
    v_cache_.clear();
    return make_error(ErrorCode::out_of_range,
                      "out of memory for a KV cache of " + std::to_string(2 * bytes) + " bytes");
  }
  kv_shape_ = shape;
  return {};
}

std::byte* CpuBackend::kv_block(std::vector<std::byte>& cache, std::int32_t layer,
                                std::int32_t block, std::int32_t kv_head) {
  const auto& s = kv_shape_;
  const std::size_t index =
      ((static_cast<std::size_t>(layer) * s.num_blocks + block) * s.num_kv_heads + kv_head) *
      s.block_size * s.head_dim * model::kv_element_bytes(s.dtype);
  return cache.data() + index;
}

Result<void> CpuBackend::supports(const model::ArchFeatures& features) const {
  (void)features;
  return {};
}

Result<model::StepShape> CpuBackend::begin_step(const model::StepInput& step) {
  if (k_cache_.empty()) return make_error(ErrorCode::invalid_argument, "no KV cache allocated");
  step_ = &step;
  step_error_.reset();
  token_seq_.resize(step.tokens.size());
  for (std::int32_t s = 0; s < step.num_seqs(); ++s) {
    for (std::int32_t i = step.query_start[s]; i < step.query_start[s + 1]; ++i) token_seq_[i] = s;
  }
  return model::StepShape{step.num_tokens(), static_cast<std::int64_t>(step.logit_rows.size()),
                          false};
}

Result<void> CpuBackend::end_step() {
  if (step_error_) return tl::make_unexpected(*step_error_);
  return {};
}

Result<void> CpuBackend::join_group(std::shared_ptr<model::Communicator> group) {
  group_ = std::move(group);
  return {};
}

bool CpuBackend::run_collective(const std::function<Result<void>()>& collective) {
  TROUPE_ASSERT(group_ != nullptr, "a collective on a backend that joined no group");
  if (step_error_) return false;  // the group is broken: the step fails at end_step
  const auto start = std::chrono::steady_clock::now();
  auto done = collective();
  all_reduce_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!done) step_error_ = done.error();
  return done.has_value();
}

void CpuBackend::all_reduce(Tensor x) {
  const OpTimer timer = time_op([] { return "all_reduce"; });
  run_collective([&] {
    return group_->all_reduce_sum({x.data, static_cast<std::size_t>(x.rows * x.cols)});
  });
}

Result<void> CpuBackend::prepare_collectives(std::int64_t max_all_reduce,
                                             std::int64_t max_gather_part) {
  if (group_ == nullptr) return {};
  return group_->reserve(static_cast<std::size_t>(max_all_reduce),
                         static_cast<std::size_t>(max_gather_part));
}

void CpuBackend::gather_columns(Tensor part, Tensor whole) {
  const OpTimer timer = time_op([] { return "gather_columns"; });
  const auto size = static_cast<std::size_t>(group_ ? group_->size() : 1);
  const auto n = static_cast<std::size_t>(part.rows * part.cols);
  const bool root = group_ && group_->rank() == 0;
  gathered_.resize(root ? n * size : 0);
  if (!run_collective([&] { return group_->gather({part.data, n}, gathered_); })) return;
  if (!root) return;
  TROUPE_ASSERT(
      whole.cols == part.cols * static_cast<std::int64_t>(size) && whole.rows >= part.rows,
      "gather_columns: the whole has the wrong shape");
  for (std::size_t r = 0; r < size; ++r) {
    const float* from = gathered_.data() + r * n;
    for (std::int64_t row = 0; row < part.rows; ++row) {
      std::copy_n(from + row * part.cols, part.cols,
                  whole.data + row * whole.cols + static_cast<std::int64_t>(r) * part.cols);
    }
  }
}

void CpuBackend::embed(const Weight& table, Tensor out) {
  const OpTimer timer = time_op([] { return "embed"; });
  const std::size_t bytes = gguf::row_bytes(table.type, table.cols);
  const auto* base = static_cast<const std::byte*>(table.data);
  pool_.parallel_for(out.rows, [&](std::int64_t t) {
    const auto status =
        gguf::dequantize_row(table.type, base + step_->tokens[t] * bytes, table.cols, row(out, t));
    TROUPE_ASSERT(status.has_value(), "embedding table of an undecodable type");
  });
}

void CpuBackend::rms_norm(Tensor x, const Weight& weight, float eps, Tensor out) {
  const OpTimer timer = time_op([] { return "rms_norm"; });
  const auto* w = static_cast<const float*>(weight.data);
  pool_.parallel_for(x.rows, [&](std::int64_t r) {
    const float* in = row(x, r);
    double sum = 0.0;
    for (std::int64_t i = 0; i < x.cols; ++i) sum += static_cast<double>(in[i]) * in[i];
    const float scale = 1.0f / std::sqrt(static_cast<float>(sum / x.cols) + eps);
    float* o = row(out, r);
    for (std::int64_t i = 0; i < x.cols; ++i) o[i] = in[i] * scale * w[i];
  });
}

const RepackedWeight* CpuBackend::repacked(const Weight& weight) {
  auto it = repacked_.find(weight.data);
  if (it == repacked_.end()) return nullptr;  // not a matrix this backend loaded to repack
  Packing& packing = it->second;
  if (!packing.tried) {
    packing.tried = true;
    try {
      const bool floats = has_float_panels(weight.type);
      auto packed = std::make_unique<RepackedWeight>(
          floats ? allocate_float_panels(weight.type, weight.rows, weight.cols)
                 : allocate_repacked(weight.type, weight.rows, weight.cols));
      const std::size_t w_row_bytes = gguf::row_bytes(weight.type, weight.cols);
      const auto* w = static_cast<const std::byte*>(weight.data);
      pool_.parallel_for(packed->groups, [&](std::int64_t g) {
        if (floats) {
          repack_float_group(*packed, w, w_row_bytes, g);
        } else {
          repack_group(*packed, w, w_row_bytes, g);
        }
      });
      packing.packed = std::move(packed);
      if (!packing.looked_up) release_pages(weight.data, w_row_bytes * weight.rows);
    } catch (const std::bad_alloc&) {
      // No memory for the copy: this weight keeps the file's layout, and its kernel, for good.
    }
  }
  const RepackedWeight* packed = packing.packed.get();
  TROUPE_ASSERT(packed == nullptr || (packed->type == weight.type && packed->rows == weight.rows &&
                                      packed->cols == weight.cols),
                "a loaded weight's shape changed");
  return packed;
}

void CpuBackend::matmul(Tensor x, const Weight& weight, Tensor out) {
  TROUPE_ASSERT(x.cols == weight.cols && out.cols == weight.rows && out.rows == x.rows,
                "matmul shapes disagree");
  const std::size_t w_row_bytes = gguf::row_bytes(weight.type, weight.cols);
  const OpTimer timer = time_op(
      [&] {
        return "matmul " + std::string(gguf::tensor_type_name(weight.type)) +
               (repacked_.count(weight.data) != 0 ? " (repacked)" : "");
      },
      static_cast<double>(x.rows) * static_cast<double>(weight.rows) *
          static_cast<double>(weight.cols),
      static_cast<double>(w_row_bytes) * static_cast<double>(weight.rows));
  const auto* w = static_cast<const std::byte*>(weight.data);
  const std::int64_t chunk = rows_per_task(weight.rows, pool_.num_threads());
  const std::int64_t num_tasks = (weight.rows + chunk - 1) / chunk;
  if (has_int8_kernel(weight.type, weight.cols)) {
    // Activations quantized once per row; the weights repacked on their first product where
    // the type has a repacked layout, else as stored.
    const RepackedWeight* packed = repacked(weight);
    int8_rows_.resize(x.rows, x.cols);
    pool_.parallel_for(x.rows, [&](std::int64_t t) { int8_rows_.quantize_row(t, row(x, t)); });
    const Int8Rows rows = int8_rows_.rows();
    pool_.parallel_for(num_tasks, [&](std::int64_t task) {
      const std::int64_t r0 = task * chunk;
      int8_product(weight.type, packed, w, w_row_bytes, rows, x.rows, r0,
                   std::min(chunk, weight.rows - r0), out.data + r0, out.cols);
    });
    return;
  }
  TROUPE_ASSERT(has_float_kernel(weight.type), "matmul weight of a type without a kernel");
  if (const RepackedWeight* packed = repacked(weight)) {
    // Float panels (float_panels.hpp); a chunk is whole groups of 16 rows.
    pool_.parallel_for(num_tasks, [&](std::int64_t task) {
      const std::int64_t g0 = task * chunk / kRepackRows;
      const std::int64_t g1 = std::min(packed->groups, (task + 1) * chunk / kRepackRows);
      float_panels_matmul(*packed, x.data, x.cols, x.rows, g0, g1, out.data, out.cols);
    });
    return;
  }
  pool_.parallel_for(num_tasks, [&](std::int64_t task) {
    const std::int64_t r0 = task * chunk;
    const std::int64_t n = std::min(chunk, weight.rows - r0);
    matmul_tile_float(weight.type, x.data, x.cols, x.rows, w + r0 * w_row_bytes, w_row_bytes, n,
                      x.cols, out.data + r0, out.cols);
  });
}

void CpuBackend::rope(Tensor x, std::int32_t head_dim, const model::RopeParams& params) {
  const OpTimer timer = time_op([] { return "rope"; });
  const std::int32_t num_heads = static_cast<std::int32_t>(x.cols / head_dim);
  const std::int32_t half = params.rot_dims / 2;
  const float theta_scale = std::pow(params.freq_base, -2.0f / static_cast<float>(params.rot_dims));
  const auto* factors =
      params.freq_factors ? static_cast<const float*>(params.freq_factors->data) : nullptr;
  pool_.parallel_for(x.rows, [&](std::int64_t t) {
    // As ggml: theta_i = freq_scale * pos * theta_scale^i / factor_i, the power built up by
    // repeated multiplication.
    thread_local std::vector<float> cos_sin;
    cos_sin.resize(2 * static_cast<std::size_t>(half));
    float theta = static_cast<float>(step_->positions[t]);
    for (std::int32_t i = 0; i < half; ++i) {
      const float extrapolated = theta / (factors ? factors[i] : 1.0f);
      float angle = params.freq_scale * extrapolated;
      if (params.ext_factor != 0.0f) {  // YaRN: toward the unscaled angle below the ramp
        const float y = (static_cast<float>(i) - params.yarn_lo) /
                        std::max(0.001f, params.yarn_hi - params.yarn_lo);
        const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * params.ext_factor;
        angle = angle * (1.0f - mix) + extrapolated * mix;
      }
      cos_sin[2 * i] = std::cos(angle) * params.mscale;
      cos_sin[2 * i + 1] = std::sin(angle) * params.mscale;
      theta *= theta_scale;
    }
    for (std::int32_t h = 0; h < num_heads; ++h) {
      float* v = row(x, t) + h * head_dim;
      for (std::int32_t i = 0; i < half; ++i) {
        const std::int32_t a = params.layout == model::RopeLayout::normal ? 2 * i : i;
        const std::int32_t b = params.layout == model::RopeLayout::normal ? 2 * i + 1 : i + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cos_sin[2 * i] - x1 * cos_sin[2 * i + 1];
        v[b] = x0 * cos_sin[2 * i + 1] + x1 * cos_sin[2 * i];
      }
    }
  });
}

void CpuBackend::store_kv(std::int32_t layer, Tensor k, Tensor v) {
  const OpTimer timer = time_op([] { return "store_kv"; });
  const auto& s = kv_shape_;
  const bool half = s.dtype == KvCacheDtype::f16;
  pool_.parallel_for(k.rows, [&](std::int64_t t) {
    const std::int32_t seq = token_seq_[t];
    const std::int32_t pos = step_->positions[t];
    const std::int32_t block = step_->block_table(seq)[pos / s.block_size];
    const std::int32_t slot = pos % s.block_size;
    for (std::int32_t h = 0; h < s.num_kv_heads; ++h) {
      // Keys transposed within the block ([head_dim][block_size]); values as rows.
      std::byte* keys = kv_block(k_cache_, layer, block, h);
      std::byte* values = kv_block(v_cache_, layer, block, h);
      const float* key = row(k, t) + h * s.head_dim;
      const float* value = row(v, t) + h * s.head_dim;
      if (half) {
        thread_local std::vector<std::uint16_t> converted;
        converted.resize(static_cast<std::size_t>(s.head_dim));
        f32_to_f16_saturated_row(key, converted.data(), s.head_dim);
        auto* kh = reinterpret_cast<std::uint16_t*>(keys);
        for (std::int32_t d = 0; d < s.head_dim; ++d) kh[d * s.block_size + slot] = converted[d];
        f32_to_f16_saturated_row(
            value, reinterpret_cast<std::uint16_t*>(values) + slot * s.head_dim, s.head_dim);
      } else {
        auto* kf = reinterpret_cast<float*>(keys);
        for (std::int32_t d = 0; d < s.head_dim; ++d) kf[d * s.block_size + slot] = key[d];
        std::memcpy(reinterpret_cast<float*>(values) + slot * s.head_dim, value,
                    s.head_dim * sizeof(float));
      }
    }
  });
}

void CpuBackend::attention(std::int32_t layer, Tensor q, const model::AttentionParams& params,
                           Tensor out) {
  const OpTimer timer = time_op([] { return "attention"; });
  const auto& s = kv_shape_;
  KvLayerView kv;
  kv.keys = kv_block(k_cache_, layer, 0, 0);
  kv.values = kv_block(v_cache_, layer, 0, 0);
  kv.dtype = s.dtype;
  kv.block_size = s.block_size;
  kv.num_kv_heads = s.num_kv_heads;
  kv.head_dim = s.head_dim;
  paged_attention(pool_, *step_, kv, q, params, out);
}

void CpuBackend::swiglu(Tensor gate, Tensor up, Tensor out) {
  const OpTimer timer = time_op([] { return "swiglu"; });
  pool_.parallel_for(gate.rows, [&](std::int64_t r) {
    swiglu_row(row(gate, r), row(up, r), row(out, r), gate.cols);
  });
}

void CpuBackend::add(Tensor x, Tensor y) {
  const OpTimer timer = time_op([] { return "add"; });
  const std::int64_t n = x.rows * x.cols;
  for (std::int64_t i = 0; i < n; ++i) x.data[i] += y.data[i];
}

void CpuBackend::add_bias(Tensor x, const Weight& bias) {
  const OpTimer timer = time_op([] { return "add_bias"; });
  TROUPE_ASSERT(bias.type == TensorType::f32 && bias.rows * bias.cols == x.cols,
                "add_bias: the bias does not fit the rows");
  const auto* b = static_cast<const float*>(bias.data);
  for (std::int64_t r = 0; r < x.rows; ++r) add_bias_row(row(x, r), b, x.cols);
}

void CpuBackend::gelu_tanh_gate(Tensor gate, Tensor up, Tensor out) {
  const OpTimer timer = time_op([] { return "gelu_tanh_gate"; });
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  pool_.parallel_for(gate.rows, [&](std::int64_t r) {
    const float* g = row(gate, r);
    const float* u = row(up, r);
    float* o = row(out, r);
    for (std::int64_t i = 0; i < gate.cols; ++i) {
      const float x = g[i];
      o[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x))) * u[i];
    }
  });
}

void CpuBackend::scale(Tensor x, float factor) {
  const OpTimer timer = time_op([] { return "scale"; });
  const std::int64_t n = x.rows * x.cols;
  for (std::int64_t i = 0; i < n; ++i) x.data[i] *= factor;
}

void CpuBackend::softcap(Tensor x, float cap) {
  const OpTimer timer = time_op([] { return "softcap"; });
  const std::int64_t n = x.rows * x.cols;
  for (std::int64_t i = 0; i < n; ++i) x.data[i] = cap * std::tanh(x.data[i] / cap);
}

void CpuBackend::gather_logit_rows(Tensor x, Tensor out) {
  const OpTimer timer = time_op([] { return "gather_logit_rows"; });
  for (std::int64_t i = 0; i < out.rows; ++i) {
    std::memcpy(row(out, i), row(x, step_->logit_rows[i]), x.cols * sizeof(float));
  }
}

Result<void> CpuBackend::read(Tensor tensor, std::span<float> host) {
  const auto n = static_cast<std::size_t>(tensor.rows * tensor.cols);
  if (host.size() < n) return make_error(ErrorCode::invalid_argument, "host buffer too small");
  std::memcpy(host.data(), tensor.data, n * sizeof(float));
  return {};
}

Result<void> CpuBackend::write(std::span<const float> host, Tensor tensor) {
  const auto n = static_cast<std::size_t>(tensor.rows * tensor.cols);
  if (host.size() < n) return make_error(ErrorCode::invalid_argument, "host buffer too small");
  std::memcpy(tensor.data, host.data(), n * sizeof(float));
  return {};
}

}  // namespace troupe::cpu
