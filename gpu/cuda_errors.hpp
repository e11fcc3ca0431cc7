// Which CUDA runtime errors end a backend and which end only a step. A sticky error
// (an illegal address, a kernel that faulted or timed out, an uncorrectable ECC error)
// leaves the device's context unusable: every later call in the process fails the same
// way until the context is destroyed. Any other error (out of memory, a bad argument, an
// invalidated capture) fails only the call that made it.
#pragma once

namespace troupe::gpu {

// `code` is a cudaError_t.
bool is_sticky_cuda_error(int code);

}  // namespace troupe::gpu
