// Which CUDA errors lose the backend (sticky: the context is unusable) and which fail only
// a step. Plain code: no device needed, only the toolkit's headers.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>

#include "gpu/cuda_errors.hpp"

using troupe::gpu::is_sticky_cuda_error;

TEST_CASE("sticky CUDA errors lose the backend, the others fail only their step", "[gpu]") {
  for (const cudaError_t sticky :
       {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorLaunchTimeout,
        cudaErrorHardwareStackError, cudaErrorIllegalInstruction, cudaErrorMisalignedAddress,
        cudaErrorInvalidAddressSpace, cudaErrorInvalidPc, cudaErrorAssert,
        cudaErrorECCUncorrectable}) {
    INFO(cudaGetErrorName(sticky));
    CHECK(is_sticky_cuda_error(sticky));
  }
  for (const cudaError_t passing :
       {cudaSuccess, cudaErrorMemoryAllocation, cudaErrorInvalidValue,
        cudaErrorInvalidConfiguration, cudaErrorLaunchOutOfResources,
        cudaErrorStreamCaptureInvalidated, cudaErrorNotReady, cudaErrorInvalidDevice}) {
    INFO(cudaGetErrorName(passing));
    CHECK_FALSE(is_sticky_cuda_error(passing));
  }
}
