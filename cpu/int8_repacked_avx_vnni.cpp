// The repacked int8 kernel on AVX2 with AVX-VNNI (256-bit vpdpbusd): int8_repacked_avx2.cpp's
// code.
#define TROUPE_REPACK_AVX_VNNI
#include "cpu/int8_repacked_avx2.cpp"  // NOLINT(bugprone-suspicious-include)
