// The int8 matmul on AVX2 with AVX-VNNI (256-bit vpdpbusd): int8_matmul_avx2.cpp's code.
#define TROUPE_INT8_AVX_VNNI
#include "cpu/int8_matmul_avx2.cpp"  // NOLINT(bugprone-suspicious-include)
