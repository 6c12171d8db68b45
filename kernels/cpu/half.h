// IEEE half precision to float, shared by the block kernels and the GGUF dequantizers.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx2.h"

namespace kvbench {

// IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN included).
inline float half_to_float(uint16_t h) {
#if KVBENCH_AVX2
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    const float f = static_cast<float>(mant) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &f, sizeof(bits));
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
#endif
}

}  // namespace kvbench
