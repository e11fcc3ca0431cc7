// TROUPE_HOST_DEVICE marks a plain function that nvcc compiles for the device too (the
// sampling rules, splitmix64); to the host compiler it is nothing.
#pragma once

#if defined(__CUDACC__)
#define TROUPE_HOST_DEVICE __host__ __device__
#else
#define TROUPE_HOST_DEVICE
#endif
