// What the CUDA backend's files share: the state behind CudaBackend::Impl and the small
// conversions every part uses. The backend is one class written in five files, one concern
// each: cuda_backend.cpp (the device, the backend's life, errors and the features it runs),
// cuda_backend_memory.cpp (allocations, weights and uploads, the KV cache),
// cuda_backend_step.cpp (a step's arrays and its CUDA graphs), cuda_backend_collectives.cpp
// (a tensor-parallel rank's NCCL calls) and cuda_backend_ops.cpp (the forward pass's ops and
// sampling). Only those files include this one.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gpu/cuda_backend.hpp"
#include "gpu/kernels.hpp"

namespace troupe::gpu {

inline cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// Values in a K or V cache of this shape.
inline std::int64_t kv_elements(const model::KvCacheShape& s) {
  return std::int64_t{s.num_layers} * s.num_blocks * s.block_size * s.num_kv_heads * s.head_dim;
}

inline kernels::Half16 half_of(gguf::TensorType type) {
  return type == gguf::TensorType::f16 ? kernels::Half16::f16 : kernels::Half16::bf16;
}

inline const char* cublas_name(cublasStatus_t s) {
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

struct CudaBackend::Impl {
  cublasHandle_t cublas = nullptr;
  void* cublas_workspace = nullptr;
  // The step's arrays on the device (capacity-sized, so graphs keep their pointers).
  Buffer tokens, positions, token_seq, slots, logit_rows, decode_rows, tiles, tables;
  Buffer cast;                 // 16-bit copy of a matmul's input
  Buffer partials;             // decode attention's per-split results
  Buffer lora_slots, lora_ax;  // LoRA: each row's adapter slot; A x, max_lora_rank_ a row
  Buffer sampling_params, sampled_ids, token_masks;
  std::vector<kernels::SamplingRowArgs> sampling_args;  // reused every step
  std::vector<std::uint64_t> mask_words;                // the rows' grammar bitmasks
  std::vector<std::int32_t> sampled;
  void* pinned = nullptr;  // host staging for a step's uploads
  std::int64_t pinned_bytes = 0;
  std::vector<void*> allocations;  // weights and tensors, freed at the end
};

}  // namespace troupe::gpu
