#include "gpu/cuda_backend.hpp"

#ifdef TROUPE_HAVE_NCCL
#include "gpu/nccl_communicator.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>

#include "gpu/cuda_backend_impl.hpp"
#include "gpu/cuda_errors.hpp"
#include "model/llama_config.hpp"

namespace troupe::gpu {

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

}  // namespace

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

}  // namespace troupe::gpu
