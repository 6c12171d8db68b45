// AVX-512 VNNI helpers shared by the integer kernels (gemm_q8.cpp, kivi_attention.cpp).
// KVBENCH_VNNI is 1 when the compiler targets AVX-512 F and VNNI.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#include <cstdint>

#define KVBENCH_VNNI 1

namespace kvbench {

// sums + the 16 lanes of w (4 unsigned bytes each) times the 4 signed bytes at `four`,
// broadcast from memory by the instruction itself: GCC 12 otherwise spends a broadcast on
// every call.
inline __m512i dpbusd_broadcast(__m512i sums, __m512i w, const int8_t* four) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(sums)
      : "v"(w), "m"(*reinterpret_cast<const int32_t*>(four)));
  return sums;
}

}  // namespace kvbench
#endif
