#include "gpu/cuda_backend.hpp"

#ifdef TROUPE_HAVE_NCCL
#include "gpu/nccl_communicator.hpp"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "gguf/dequantize.hpp"
#include "gguf/half.hpp"
#include "gpu/cuda_errors.hpp"
#include "gpu/kernels.hpp"
#include "model/llama_config.hpp"

namespace troupe::gpu {

using gguf::TensorType;
using model::Tensor;
using model::Weight;

namespace {

constexpr std::size_t kCublasWorkspace = std::size_t{32} << 20;

// The backends alive on each device of this process, and the devices whose context a
// sticky error spoiled: such a device is reset when its last backend goes, and a new
// backend waits for that (a worker's replacement must not start on a dead context, nor
// beside a backend that still holds its memory).
struct Devices {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<int, int> live;
  std::set<int> spoiled;
};

Devices& devices() {
  static Devices d;
  return d;
}

constexpr auto kReleaseWait = std::chrono::seconds(60);

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// Values in a K or V cache of this shape.
std::int64_t kv_elements(const model::KvCacheShape& s) {
  return std::int64_t{s.num_layers} * s.num_blocks * s.block_size * s.num_kv_heads * s.head_dim;
}

kernels::Half16 half_of(TensorType type) {
  return type == TensorType::f16 ? kernels::Half16::f16 : kernels::Half16::bf16;
}

cudaDataType_t cuda_type_of(TensorType type) {
  return type == TensorType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

const char* cublas_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "not supported";
    default:
      return "error";
  }
}

}  // namespace

struct CudaBackend::Impl {
  cublasHandle_t cublas = nullptr;
  void* cublas_workspace = nullptr;
  // The step's arrays on the device (capacity-sized, so graphs keep their pointers).
  Buffer tokens, positions, token_seq, slots, logit_rows, decode_rows, tiles, tables;
  Buffer cast;      // 16-bit copy of a matmul's input
  Buffer partials;  // decode attention's per-split results
  Buffer sampling_params, sampled_ids, token_masks;
  std::vector<kernels::SamplingRowArgs> sampling_args;  // reused every step
  std::vector<std::uint64_t> mask_words;                // the rows' grammar bitmasks
  std::vector<std::int32_t> sampled;
  void* pinned = nullptr;  // host staging for a step's uploads
  std::int64_t pinned_bytes = 0;
  std::vector<void*> allocations;  // weights and tensors, freed at the end
};

Result<DeviceInfo> probe_device(int ordinal) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // Without a GPU and its driver the runtime says "driver version is insufficient".
    return make_error(ErrorCode::unsupported, std::string("no CUDA device (cudaGetDeviceCount: ") +
                                                  cudaGetErrorString(e) + ")");
  }
  if (count <= ordinal) {
    return make_error(ErrorCode::unsupported, "no CUDA device " + std::to_string(ordinal) + " (" +
                                                  std::to_string(count) + " found)");
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
    return make_error(ErrorCode::unsupported, "cannot read CUDA device " + std::to_string(ordinal));
  }
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  if (cudaSetDevice(ordinal) == cudaSuccess) {
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
      info.free_bytes = static_cast<std::int64_t>(free);
      info.total_bytes = static_cast<std::int64_t>(total);
    }
  }
  return info;
}

CudaBackend::CudaBackend(const CudaBackendOptions& options)
    : options_(options), impl_(std::make_unique<Impl>()) {
  graph_policy_.enabled = options.cuda_graphs;
  graph_policy_.max_batch = options.max_graph_batch;
  // Graphs serve contexts up to kGraphMaxContext; longer steps run eagerly.
  graph_policy_.max_model_len = std::min(options.max_model_len, kGraphMaxContext);
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const CudaBackendOptions& options) {
  {
    auto& d = devices();
    std::unique_lock lock(d.mutex);
    if (!d.changed.wait_for(lock, kReleaseWait,
                            [&] { return !d.spoiled.contains(options.device); })) {
      return make_error(ErrorCode::unavailable,
                        "GPU " + std::to_string(options.device) +
                            " is still held by a backend that hit a sticky CUDA error");
    }
  }
  TROUPE_TRY(auto device, probe_device(options.device));
  if (device.compute_major < 8) {
    return make_error(ErrorCode::unsupported, "CUDA device " + device.name +
                                                  " has compute capability " +
                                                  std::to_string(device.compute_major) + "." +
                                                  std::to_string(device.compute_minor) +
                                                  "; troupe needs 8.0 or newer (BF16)");
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(options));
  backend->device_ = device;
  {
    auto& d = devices();
    const std::lock_guard lock(d.mutex);
    ++d.live[options.device];
    backend->counted_ = true;
  }
  TROUPE_TRY_VOID(backend->init());
  return backend;
}

Result<void> CudaBackend::init() {
  if (!check(cudaSetDevice(options_.device), "cudaSetDevice")) return status();
  cudaStream_t stream = nullptr;
  if (!check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
    return status();
  }
  stream_ = stream;
  const cublasStatus_t created = cublasCreate(&impl_->cublas);
  if (created != CUBLAS_STATUS_SUCCESS) {
    return make_error(ErrorCode::internal,
                      std::string("cuBLAS would not start: ") + cublas_name(created));
  }
  cublasSetStream(impl_->cublas, stream);
  // A workspace of its own, so that cuBLAS allocates nothing while a graph records.
  TROUPE_TRY(impl_->cublas_workspace, device_alloc(kCublasWorkspace));
  cublasSetWorkspace(impl_->cublas, impl_->cublas_workspace, kCublasWorkspace);
  if (!check(kernels::prepare_attention(), "attention kernel set-up")) return status();
  return {};
}

CudaBackend::~CudaBackend() {
  select_device();
#ifdef TROUPE_HAVE_NCCL
  // Collectives a gone peer never finishes: the bounded wait aborts them, and the stream
  // can then drain.
  if (nccl_ != nullptr) (void)nccl_->synchronize();
#endif
  if (stream_ != nullptr) cudaStreamSynchronize(as_stream(stream_));
  nccl_ = nullptr;
  group_.reset();  // its collectives ran on this stream
  invalidate_graphs();
  for (Buffer* b :
       {&impl_->tokens, &impl_->positions, &impl_->token_seq, &impl_->slots, &impl_->logit_rows,
        &impl_->decode_rows, &impl_->tiles, &impl_->tables, &impl_->cast, &impl_->partials,
        &impl_->sampling_params, &impl_->sampled_ids, &impl_->token_masks}) {
    if (b->data != nullptr) cudaFree(b->data);
  }
  for (void* p : impl_->allocations) cudaFree(p);
  release_buffer(k_cache_);
  release_buffer(v_cache_);
  if (impl_->cublas_workspace != nullptr) cudaFree(impl_->cublas_workspace);
  if (gathered_ != nullptr) cudaFree(gathered_);
  if (impl_->pinned != nullptr) cudaFreeHost(impl_->pinned);
  if (impl_->cublas != nullptr) cublasDestroy(impl_->cublas);
  if (stream_ != nullptr) cudaStreamDestroy(as_stream(stream_));
  if (!counted_) return;
  auto& d = devices();
  const std::lock_guard lock(d.mutex);
  if (--d.live[options_.device] == 0 && d.spoiled.contains(options_.device)) {
    // The context is unusable and nothing else here holds it: destroy it, so that the next
    // backend on this device starts on a fresh one with all the memory back.
    cudaDeviceReset();
    d.spoiled.erase(options_.device);
  }
  d.changed.notify_all();
}

std::string CudaBackend::describe() const {
  return "CUDA " + device_.name + " (compute " + std::to_string(device_.compute_major) + "." +
         std::to_string(device_.compute_minor) + ", " + std::to_string(device_.multiprocessors) +
         " SMs)";
}

bool CudaBackend::check(int status_code, const char* what) {
  const auto e = static_cast<cudaError_t>(status_code);
  if (e == cudaSuccess) return true;
  std::string why = std::string(what) + ": " + cudaGetErrorString(e);
  if (is_sticky_cuda_error(e)) {
    lose(std::move(why));
  } else {
    cudaGetLastError();  // not sticky: clear it, so that it fails this call only
    if (error_.empty()) error_ = std::move(why);
  }
  return false;
}

void CudaBackend::lose(std::string why) {
  if (lost_) return;
  error_ = std::move(why);  // what lost it is what every later call reports
  lost_ = true;
  auto& d = devices();
  const std::lock_guard lock(d.mutex);
  d.spoiled.insert(options_.device);
}

Result<void> CudaBackend::status() const {
  if (error_.empty()) return {};
  return make_error(ErrorCode::internal, "CUDA backend: " + error_);
}

Result<void> CudaBackend::synchronize() {
  select_device();
#ifdef TROUPE_HAVE_NCCL
  if (nccl_ != nullptr) {
    // A collective may never finish (a rank gone): wait no longer than the group's timeout.
    // A collective that never finished breaks the group: the backend cannot go on.
    if (auto waited = nccl_->synchronize(); !waited) lose(waited.error().message);
  } else {
    check(cudaStreamSynchronize(as_stream(stream_)), "stream synchronize");
  }
#else
  check(cudaStreamSynchronize(as_stream(stream_)), "stream synchronize");
#endif
  check(cudaGetLastError(), "kernel");
  return status();
}

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

void CudaBackend::select_device() const {
  // Per host thread: an actor's messages may run on any of the scheduler's threads.
  cudaSetDevice(options_.device);
}

Result<void> CudaBackend::check_heads(std::int32_t num_heads, std::int32_t num_kv_heads,
                                      std::int32_t head_dim) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) {
    return make_error(ErrorCode::unsupported,
                      "the CUDA kernels need num_heads to be a multiple of "
                      "num_kv_heads");
  }
  // The decode kernel splits a head into 8-value pieces over whole warps: a power of two.
  const bool dim_ok =
      head_dim >= 8 && head_dim <= kernels::kMaxHeadDim && (head_dim & (head_dim - 1)) == 0;
  if (num_heads / num_kv_heads > kernels::kMaxGroup || !dim_ok) {
    return make_error(ErrorCode::unsupported,
                      "the CUDA kernels take up to " + std::to_string(kernels::kMaxGroup) +
                          " query heads per KV head and a head_dim that is a power of two from 8 "
                          "to " +
                          std::to_string(kernels::kMaxHeadDim) + "; this model has " +
                          std::to_string(num_heads / num_kv_heads) + " and " +
                          std::to_string(head_dim));
  }
  return {};
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
  // A whole graph batch at the graphs' reach in one launch, reserved before the KV pool
  // takes what is free; longer eager steps launch their decode rows in chunks within it.
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
  if (shape.dtype != model::KvCacheDtype::f16) {
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

void CudaBackend::invalidate_graphs() {
  for (auto& [batch, exec] : graphs_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
  graphs_.clear();
  warmed_.clear();
}

// --- steps ---

model::StepPlan CudaBackend::step_shape(const model::StepInput& step) const {
  const std::int32_t rows = planned_rows(step, graph_policy_);
  const bool padded = rows != step.num_tokens();
  return model::StepPlan{rows, padded ? rows : static_cast<std::int64_t>(step.logit_rows.size()),
                         false};
}

Result<void> CudaBackend::ensure_step_capacity(const StepLayout& l) {
  bool moved = false;
  const auto ints = [](std::size_t n) {
    return static_cast<std::int64_t>(std::max<std::size_t>(n, 1) * 4);
  };
  auto& m = *impl_;
  for (auto [buffer, bytes] : std::initializer_list<std::pair<Buffer*, std::int64_t>>{
           {&m.tokens, ints(l.tokens.size())},
           {&m.positions, ints(l.positions.size())},
           {&m.token_seq, ints(l.token_seq.size())},
           {&m.slots, ints(l.slots.size())},
           {&m.logit_rows, ints(l.logit_row_index.size())},
           {&m.decode_rows, ints(l.decode_rows.size())},
           {&m.tiles, ints(l.tiles.size() * 2)},
           // A graph's tables have room for its whole batch, whatever the step fills.
           {&m.tables,
            ints(std::max(l.block_tables.size(), static_cast<std::size_t>(l.rows) *
                                                     static_cast<std::size_t>(l.block_stride)))}}) {
    TROUPE_TRY(const bool grew, grow(*buffer, bytes));
    moved = moved || grew;
  }
  // The decode partials (reserved by prepare_attention): room for one decode row at least,
  // since attention launches the rows in chunks that fit. Heads are bounded until known.
  const std::int32_t heads =
      num_heads_ > 0 ? num_heads_ : kv_shape_.num_kv_heads * kernels::kMaxGroup;
  const std::int64_t partial_floats =
      std::max<std::int64_t>(1, decode_partial_floats(l.decode_rows.empty() ? 0 : 1, heads,
                                                      l.num_splits, kv_shape_.head_dim));
  TROUPE_TRY(const bool grew_partials, grow(m.partials, partial_floats * 4));
  const std::int64_t staging =
      4 * static_cast<std::int64_t>(l.tokens.size() * 4 + l.logit_row_index.size() +
                                    l.decode_rows.size() + l.tiles.size() * 2 +
                                    l.block_tables.size()) +
      64 * 8;
  if (m.pinned_bytes < staging) {
    if (m.pinned != nullptr) cudaFreeHost(m.pinned);
    m.pinned = nullptr;
    const std::int64_t size = std::max<std::int64_t>(staging, m.pinned_bytes * 2);
    if (!check(cudaMallocHost(&m.pinned, static_cast<std::size_t>(size)), "pinned staging")) {
      m.pinned_bytes = 0;
      return status();
    }
    m.pinned_bytes = size;
  }
  if (moved || grew_partials) invalidate_graphs();
  return {};
}

Result<model::StepPlan> CudaBackend::begin_step(const model::StepInput& step) {
  if (step_open_) return make_error(ErrorCode::internal, "a step began before the last one ended");
  if (!lost_) error_.clear();  // the last step's failure (not sticky) was its own
  TROUPE_TRY_VOID(status());
  if (k_cache_.data == nullptr) {
    return make_error(ErrorCode::invalid_argument, "no KV cache allocated");
  }
  // The worker's thread may not be the one that made the backend: the device is per thread.
  if (!check(cudaSetDevice(options_.device), "cudaSetDevice")) {
    return tl::make_unexpected(status().error());
  }
  // The staging buffer is reused: the previous step's uploads must have landed.
  TROUPE_TRY_VOID(synchronize());
  layout_ = plan_step(step, kv_shape_.block_size, graph_policy_);
  cast_ = CastCopy{};  // a replayed step leaves the buffer holding what its graph wrote last
  TROUPE_TRY_VOID(ensure_step_capacity(layout_));

  // Pack every array into pinned memory, then one copy each.
  auto& m = *impl_;
  auto* staging = static_cast<std::uint8_t*>(m.pinned);
  std::size_t offset = 0;
  const auto upload = [&](Buffer& buffer, const void* data, std::size_t bytes) {
    if (bytes == 0) return;
    std::memcpy(staging + offset, data, bytes);
    check(cudaMemcpyAsync(buffer.data, staging + offset, bytes, cudaMemcpyHostToDevice,
                          as_stream(stream_)),
          "step upload");
    offset += (bytes + 15) / 16 * 16;
  };
  const auto& l = layout_;
  upload(m.tokens, l.tokens.data(), l.tokens.size() * 4);
  upload(m.positions, l.positions.data(), l.positions.size() * 4);
  upload(m.token_seq, l.token_seq.data(), l.token_seq.size() * 4);
  upload(m.slots, l.slots.data(), l.slots.size() * 4);
  upload(m.logit_rows, l.logit_row_index.data(), l.logit_row_index.size() * 4);
  upload(m.decode_rows, l.decode_rows.data(), l.decode_rows.size() * 4);
  upload(m.tiles, l.tiles.data(), l.tiles.size() * sizeof(kernels::PrefillTile));
  upload(m.tables, l.block_tables.data(), l.block_tables.size() * 4);
  TROUPE_TRY_VOID(status());

  model::StepPlan plan{l.rows, l.graph ? l.rows : static_cast<std::int64_t>(step.logit_rows.size()),
                       false};
  step_open_ = true;
  capturing_ = replaying_ = false;
  if (l.graph) {
    graph_key_ = l.graph_key;
    if (graphs_.contains(graph_key_)) {
      replaying_ = true;
      plan.replay = true;
    } else if (!warmed_.contains(graph_key_)) {
      // A batch size's first step runs eagerly: cuBLAS picks its kernels and lazily loaded
      // modules load outside any capture. The next one is recorded.
      warmed_.insert(graph_key_);
    } else if (check(cudaStreamBeginCapture(as_stream(stream_), cudaStreamCaptureModeThreadLocal),
                     "graph capture")) {
      capturing_ = true;
    } else {
      step_open_ = false;
      return tl::make_unexpected(status().error());
    }
  }
  return plan;
}

Result<void> CudaBackend::end_step() {
  if (!step_open_) return status();
  step_open_ = false;
  cast_ = CastCopy{};
  if (capturing_) {
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const bool captured = check(cudaStreamEndCapture(as_stream(stream_), &graph), "graph capture");
    if (captured && error_.empty()) {
      cudaGraphExec_t exec = nullptr;
      if (check(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate")) {
        graphs_[graph_key_] = exec;
        replaying_ = true;
      }
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  if (replaying_) {
    replaying_ = false;
    const auto it = graphs_.find(graph_key_);
    if (it != graphs_.end() &&
        check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(it->second), as_stream(stream_)),
              "graph launch")) {
      ++num_replays_;
    }
  }
  check(cudaGetLastError(), "kernel launch");
  // A rank of a group that reads nothing back still finds out now whether its collectives
  // finished.
  if (nccl_ != nullptr) return synchronize();
  return status();
}

// --- tensor parallelism ---

Result<void> CudaBackend::join_group(std::shared_ptr<model::Communicator> group) {
  select_device();
#ifdef TROUPE_HAVE_NCCL
  auto* nccl = dynamic_cast<NcclCommunicator*>(group.get());
  if (nccl == nullptr) {
    return make_error(ErrorCode::unsupported, "a CUDA rank needs an NCCL communicator");
  }
  nccl->bind_stream(stream_);
  group_ = std::move(group);
  nccl_ = nccl;
  // NCCL calls stay out of recorded graphs: every step runs eagerly.
  graph_policy_.enabled = false;
  invalidate_graphs();
  return {};
#else
  (void)group;
  return make_error(ErrorCode::unsupported,
                    "this troupe was built without NCCL, which CUDA ranks of a group need");
#endif
}

void CudaBackend::all_reduce(Tensor x) {
  TROUPE_ASSERT(group_ != nullptr, "all_reduce on a backend that joined no group");
  wrote(x);
  if (!error_.empty()) return;
  auto summed = group_->all_reduce_sum({x.data, static_cast<std::size_t>(x.rows * x.cols)});
  if (!summed) error_ = summed.error().message;
}

Result<void> CudaBackend::grow_gathered(std::int64_t bytes) {
  if (gathered_bytes_ >= bytes) return {};
  if (gathered_ != nullptr) {
    // The old buffer may still be read by this step's queued work: a bounded wait.
    TROUPE_TRY_VOID(synchronize());
    cudaFree(gathered_);
    bytes_in_use_ -= gathered_bytes_;
    gathered_ = nullptr;
    gathered_bytes_ = 0;
  }
  TROUPE_TRY(gathered_, device_alloc(bytes));
  gathered_bytes_ = bytes;
  return {};
}

Result<void> CudaBackend::prepare_collectives(std::int64_t max_all_reduce,
                                              std::int64_t max_gather_part) {
  if (group_ == nullptr) return {};
  select_device();
  TROUPE_TRY_VOID(status());
  if (group_->rank() == 0 && max_gather_part > 0) {
    TROUPE_TRY_VOID(grow_gathered(max_gather_part * group_->size() * 4));
  }
  // It waits for its own warm-up. A failure here fails the load: the group is formed again
  // with the next backend.
  return group_->reserve(static_cast<std::size_t>(max_all_reduce),
                         static_cast<std::size_t>(max_gather_part));
}

void CudaBackend::gather_columns(Tensor part, Tensor whole) {
  TROUPE_ASSERT(group_ != nullptr, "gather_columns on a backend that joined no group");
  if (!error_.empty()) return;
  const auto size = static_cast<std::int64_t>(group_->size());
  const std::int64_t n = part.rows * part.cols;
  const bool root = group_->rank() == 0;
  if (root) {
    wrote(whole);
    TROUPE_ASSERT(whole.cols == part.cols * size && whole.rows >= part.rows,
                  "gather_columns: the whole has the wrong shape");
  }
  if (root) {
    if (auto grown = grow_gathered(n * size * 4); !grown) {
      if (error_.empty()) error_ = grown.error().message;
      return;
    }
  }
  auto* gathered = static_cast<float*>(gathered_);
  auto done = group_->gather({part.data, static_cast<std::size_t>(n)},
                             {gathered, root ? static_cast<std::size_t>(n * size) : 0});
  if (!done) {
    error_ = done.error().message;
    return;
  }
  if (!root) return;
  // Rank r's [rows, part.cols] into columns [r * part.cols, ...) of every row.
  for (std::int64_t r = 0; r < size; ++r) {
    check(cudaMemcpy2DAsync(whole.data + r * part.cols, whole.cols * 4, gathered + r * n,
                            part.cols * 4, part.cols * 4, part.rows, cudaMemcpyDeviceToDevice,
                            as_stream(stream_)),
          "gather columns");
  }
}

// --- ops ---

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

Result<void> CudaBackend::supports(const model::ArchFeatures& features) const {
  // What the CUDA kernels do not implement yet: refused at load, by name, rather than run
  // wrongly (the CPU backend runs them all).
  std::string missing;
  const auto name = [&](bool lacks, const char* what) {
    if (!lacks) return;
    if (!missing.empty()) missing += ", ";
    missing += what;
  };
  name(features.num_experts > 0, "mixture of experts");
  name(features.attention_sinks, "attention sinks");
  name(features.yarn_rope, "YaRN RoPE");
  if (missing.empty()) return {};
  return make_error(ErrorCode::unsupported,
                    describe() + " does not implement this model's " + missing + " yet");
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

void CudaBackend::gather_logit_rows(Tensor x, Tensor out) {
  wrote(out);
  kernels::gather_rows(x.data, static_cast<const std::int32_t*>(impl_->logit_rows.data), out.data,
                       out.rows, x.cols, as_stream(stream_));
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
