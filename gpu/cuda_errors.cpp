#include "gpu/cuda_errors.hpp"

#include <cuda_runtime_api.h>

namespace troupe::gpu {

bool is_sticky_cuda_error(int code) {
  // The runtime's documentation marks these as leaving the process in an inconsistent
  // state ("any further CUDA work will return the same error").
  switch (static_cast<cudaError_t>(code)) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

}  // namespace troupe::gpu
