#include "actors/backends.hpp"

#include <algorithm>

#include "cpu/cpu_backend.hpp"
#ifdef TROUPE_HAVE_CUDA
#include "gpu/cuda_backend.hpp"
#endif

namespace troupe::actors {

Result<std::unique_ptr<model::Backend>> make_backend(const EngineConfig& config,
                                                     std::int32_t max_model_len) {
  if (config.device == Device::cpu) return std::make_unique<cpu::CpuBackend>(config.num_threads);
#ifdef TROUPE_HAVE_CUDA
  gpu::CudaBackendOptions options;
  options.cuda_graphs = config.cuda_graphs;
  options.max_graph_batch = std::min(config.max_num_seqs, 256);
  options.max_model_len = max_model_len;
  TROUPE_TRY(auto backend, gpu::CudaBackend::create(options));
  return std::unique_ptr<model::Backend>(std::move(backend));
#else
  (void)max_model_len;
  return make_error(ErrorCode::unsupported,
                    "this troupe was built without CUDA (no nvcc when it was configured)");
#endif
}

Result<void> check_model(const EngineConfig& config, const model::LlamaConfig& model) {
#ifdef TROUPE_HAVE_CUDA
  if (config.device == Device::cuda) {
    return gpu::CudaBackend::check_heads(model.num_heads, model.num_kv_heads, model.head_dim);
  }
#endif
  (void)config, (void)model;
  return {};
}

Result<std::int32_t> gpu_kv_blocks_that_fit(const EngineConfig& config, model::Backend& backend,
                                            const model::KvCacheShape& shape) {
#ifdef TROUPE_HAVE_CUDA
  if (config.device == Device::cuda) {
    return static_cast<gpu::CudaBackend&>(backend).kv_blocks_that_fit(
        shape, config.gpu_memory_utilization);
  }
#endif
  (void)config, (void)backend, (void)shape;
  return make_error(ErrorCode::unsupported, "only a CUDA device sizes its KV cache from memory");
}

}  // namespace troupe::actors
