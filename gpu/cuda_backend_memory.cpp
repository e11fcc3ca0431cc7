// CudaBackend's memory: device allocations, weights uploaded (decoded to F16 or BF16), the
// activation tensors, the KV cache, and the test hooks that read and write tensors.
#include <algorithm>
#include <vector>

#include "gguf/dequantize.hpp"
#include "gguf/half.hpp"
#include "gpu/cuda_backend_impl.hpp"

namespace troupe::gpu {

using gguf::TensorType;
using model::Tensor;
using model::Weight;

Result<void*> CudaBackend::device_alloc(std::int64_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1)));
  if (e != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky: clear it
    return make_error(ErrorCode::out_of_range, "out of GPU memory for " + std::to_string(bytes) +
                                                   " bytes (" + cudaGetErrorString(e) + ")");
  }
  bytes_in_use_ += bytes;
  return p;
}

Result<bool> CudaBackend::grow(Buffer& b, std::int64_t bytes) {
  if (b.bytes >= bytes) return false;
  // The old buffer goes first (cudaFree waits for the work that reads it), so the two are
  // never held at once; a quarter more than asked spares a regrowth per small step.
  const std::int64_t size = std::max<std::int64_t>(bytes, b.bytes + b.bytes / 4);
  release_buffer(b);
  TROUPE_TRY(void* p, device_alloc(size));
  b.data = p;
  b.bytes = size;
  return true;
}

Result<std::int64_t> CudaBackend::free_bytes() const {
  select_device();
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    return make_error(ErrorCode::internal, "cannot read the GPU's free memory");
  }
  return static_cast<std::int64_t>(free);
}

Result<void> CudaBackend::prepare_attention(std::int32_t num_heads, std::int32_t head_dim) {
  select_device();
  num_heads_ = num_heads;
  // Decode attention's scratch (each split's partial results), sized for a whole graph batch
  // at the longest context a graph serves so that one launch covers it, and taken now,
  // before the KV pool takes what is free. Eager steps with more decode rows launch them in
  // chunks that fit it.
  const std::int64_t floats = reserved_decode_floats(graph_policy_, num_heads, head_dim);
  TROUPE_TRY(const bool grew, grow(impl_->partials, std::max<std::int64_t>(floats, 1) * 4));
  if (grew) invalidate_graphs();
  return {};
}

std::int64_t CudaBackend::kv_block_bytes(const model::KvCacheShape& shape) const {
  model::KvCacheShape one_block = shape;
  one_block.num_blocks = 1;
  return 2 * kv_elements(one_block) * 2;  // K and V, half
}

Result<Weight> CudaBackend::load_weight(const gguf::GgufTensorInfo& info) {
  select_device();
  const std::int64_t cols = info.dims[0];
  const std::int64_t rows = info.dims[1] * info.dims[2] * info.dims[3];
  // Vectors (norm weights, RoPE factors) stay F32.
  if (rows == 1 && info.type == TensorType::f32) {
    TROUPE_TRY(void* p, device_alloc(cols * 4));
    impl_->allocations.push_back(p);
    weight_bytes_ += cols * 4;
    if (!check(cudaMemcpy(p, info.data, cols * 4, cudaMemcpyHostToDevice), "weight upload")) {
      return tl::make_unexpected(status().error());
    }
    return Weight{p, TensorType::f32, 1, cols};
  }
  TensorType target = TensorType::bf16;
  if (options_.weight_dtype == WeightDtype::f16) target = TensorType::f16;
  if (options_.weight_dtype == WeightDtype::automatic && info.type == TensorType::f16) {
    target = TensorType::f16;
  }
  const std::int64_t bytes = rows * cols * 2;
  TROUPE_TRY(void* p, device_alloc(bytes));
  impl_->allocations.push_back(p);
  weight_bytes_ += bytes;
  const auto* src = reinterpret_cast<const std::uint8_t*>(info.data);
  // Already in the target type: straight from the mapping. Otherwise decoded row by row.
  const void* upload = src;
  std::vector<std::uint16_t> host;
  if (info.type != target) {
    host.resize(static_cast<std::size_t>(rows * cols));
    upload = host.data();
    std::vector<float> row(static_cast<std::size_t>(cols));
    const std::size_t row_bytes = gguf::row_bytes(info.type, cols);
    for (std::int64_t r = 0; r < rows; ++r) {
      TROUPE_TRY_VOID(gguf::dequantize_row(info.type, src + r * row_bytes, cols, row.data()));
      std::uint16_t* out = host.data() + r * cols;
      for (std::int64_t c = 0; c < cols; ++c) {
        out[c] = target == TensorType::f16 ? gguf::f32_to_f16(row[c]) : gguf::f32_to_bf16(row[c]);
      }
    }
  }
  if (!check(cudaMemcpy(p, upload, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice),
             "weight upload")) {
    return tl::make_unexpected(status().error());
  }
  matmul_type_ = target;
  return Weight{p, target, rows, cols};
}

Result<model::LoraWeights> CudaBackend::upload_lora(const model::LoraWeights& host) {
  select_device();
  model::LoraWeights placed;
  for (auto [from, to] : {std::pair{&host.a, &placed.a}, std::pair{&host.b_t, &placed.b_t}}) {
    if (from->type != TensorType::f32 && from->type != TensorType::f16) {
      if (placed.a.data != nullptr) release_lora(placed);
      return make_error(ErrorCode::unsupported, "a LoRA matrix on the GPU is F16 or F32");
    }
    const std::int64_t bytes = from->rows * from->cols * (from->type == TensorType::f16 ? 2 : 4);
    auto p = device_alloc(bytes);
    if (!p) {
      if (placed.a.data != nullptr) release_lora(placed);
      return make_error(ErrorCode::out_of_range, "LoRA adapter: " + p.error().message);
    }
    impl_->allocations.push_back(*p);
    *to = Weight{*p, from->type, from->rows, from->cols};
    if (!check(cudaMemcpy(*p, from->data, static_cast<std::size_t>(bytes), cudaMemcpyHostToDevice),
               "LoRA upload")) {
      release_lora(placed);
      return tl::make_unexpected(status().error());
    }
  }
  max_lora_rank_ = std::max(max_lora_rank_, host.a.rows);
  return placed;
}

void CudaBackend::release_lora(const model::LoraWeights& uploaded) {
  select_device();
  auto& a = impl_->allocations;
  for (const Weight* w : {&uploaded.a, &uploaded.b_t}) {
    const auto it = std::find(a.begin(), a.end(), const_cast<void*>(w->data));
    if (it == a.end()) continue;
    cudaFree(*it);  // waits for the work that reads it
    bytes_in_use_ -= w->rows * w->cols * (w->type == TensorType::f16 ? 2 : 4);
    a.erase(it);
  }
}

Result<Weight> CudaBackend::random_weight(std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                                          float scale) {
  select_device();
  const TensorType type =
      options_.weight_dtype == WeightDtype::f16 ? TensorType::f16 : TensorType::bf16;
  const std::int64_t bytes = rows * cols * 2;
  TROUPE_TRY(void* p, device_alloc(bytes));
  impl_->allocations.push_back(p);
  weight_bytes_ += bytes;
  kernels::fill_random_16(p, half_of(type), rows * cols, seed, scale, as_stream(stream_));
  matmul_type_ = type;
  TROUPE_TRY_VOID(synchronize());
  return Weight{p, type, rows, cols};
}

Result<Weight> CudaBackend::random_vector(std::int64_t size, std::uint64_t seed, float scale,
                                          float offset) {
  select_device();
  TROUPE_TRY(void* p, device_alloc(size * 4));
  impl_->allocations.push_back(p);
  weight_bytes_ += size * 4;
  kernels::fill_random_f32(static_cast<float*>(p), size, seed, scale, offset, as_stream(stream_));
  TROUPE_TRY_VOID(synchronize());
  return Weight{p, TensorType::f32, 1, size};
}

Result<Tensor> CudaBackend::allocate(std::int64_t rows, std::int64_t cols) {
  select_device();
  TROUPE_TRY(void* p, device_alloc(rows * cols * 4));
  impl_->allocations.push_back(p);
  invalidate_graphs();  // recorded steps point at the old buffers
  // Any tensor may feed a matmul, whose input is cast to 16 bits first.
  cudaStreamSynchronize(as_stream(stream_));
  cast_ = CastCopy{};  // the cast buffer may move (grow)
  TROUPE_TRY_VOID(grow(impl_->cast, rows * cols * 2));
  return Tensor{static_cast<float*>(p), rows, cols};
}

void CudaBackend::release(Tensor tensor) {
  select_device();
  auto& a = impl_->allocations;
  const auto it = std::find(a.begin(), a.end(), static_cast<void*>(tensor.data));
  if (it == a.end()) return;
  cudaStreamSynchronize(as_stream(stream_));
  invalidate_graphs();
  if (cast_.source == tensor.data) cast_ = CastCopy{};  // its address may come back
  cudaFree(*it);
  bytes_in_use_ -= tensor.rows * tensor.cols * 4;
  a.erase(it);
}

void CudaBackend::release_buffer(Buffer& b) {
  if (b.data != nullptr) cudaFree(b.data);
  bytes_in_use_ -= b.bytes;
  b = Buffer{};
}

Result<void> CudaBackend::allocate_kv_cache(const model::KvCacheShape& shape) {
  select_device();
  if (shape.num_layers <= 0 || shape.num_blocks <= 0 || shape.block_size <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return make_error(ErrorCode::invalid_argument, "KV cache dimensions must be positive");
  }
  TROUPE_TRY_VOID(check_heads(shape.num_kv_heads, shape.num_kv_heads, shape.head_dim));
  if (shape.dtype != KvCacheDtype::f16) {
    return make_error(ErrorCode::unsupported, "the CUDA backend keeps its KV cache in F16");
  }
  cudaStreamSynchronize(as_stream(stream_));
  invalidate_graphs();
  release_buffer(k_cache_);
  release_buffer(v_cache_);
  const std::int64_t bytes = kv_elements(shape) * 2;  // half precision
  TROUPE_TRY_VOID(grow(k_cache_, bytes));
  if (auto v = grow(v_cache_, bytes); !v) {
    release_buffer(k_cache_);
    return tl::make_unexpected(v.error());
  }
  // Zeros: a slot read before it is written (never, by the engine's rules) stays finite.
  for (const Buffer* b : {&k_cache_, &v_cache_}) {
    check(cudaMemsetAsync(b->data, 0, static_cast<std::size_t>(bytes), as_stream(stream_)),
          "memset");
  }
  kv_shape_ = shape;
  return synchronize();
}

Result<void> CudaBackend::randomize_kv_cache(std::uint64_t seed) {
  select_device();
  if (k_cache_.data == nullptr) {
    return make_error(ErrorCode::invalid_argument, "no KV cache allocated");
  }
  const std::int64_t n = kv_elements(kv_shape_);
  kernels::fill_random_16(k_cache_.data, kernels::Half16::f16, n, seed, 1.0f, as_stream(stream_));
  kernels::fill_random_16(v_cache_.data, kernels::Half16::f16, n, seed + 1, 1.0f,
                          as_stream(stream_));
  return synchronize();
}

Result<void> CudaBackend::read(Tensor tensor, std::span<float> host) {
  select_device();
  const auto n = static_cast<std::size_t>(tensor.rows * tensor.cols);
  if (host.size() < n) return make_error(ErrorCode::invalid_argument, "host buffer too small");
  check(
      cudaMemcpyAsync(host.data(), tensor.data, n * 4, cudaMemcpyDeviceToHost, as_stream(stream_)),
      "read");
  return synchronize();
}

Result<void> CudaBackend::write(Tensor tensor, std::span<const float> host) {
  select_device();
  wrote(tensor);
  const auto n = static_cast<std::size_t>(tensor.rows * tensor.cols);
  if (host.size() < n) return make_error(ErrorCode::invalid_argument, "host buffer too small");
  check(
      cudaMemcpyAsync(tensor.data, host.data(), n * 4, cudaMemcpyHostToDevice, as_stream(stream_)),
      "write");
  return synchronize();
}

void CudaBackend::poison(Tensor tensor) {
  wrote(tensor);
  kernels::fill_nan(tensor.data, tensor.rows * tensor.cols, as_stream(stream_));
}

}  // namespace troupe::gpu
