// The narrow element conversions (kernels/layouts.h, KvElement) as the CUDA kernels do them,
// written once for the device and the host: integer bit operations and rintf only (round to
// nearest even on the device and in the host's default rounding mode), no fp16/fp8
// intrinsics, whose NaN and saturation rules differ from kernels/cpu/narrow.cpp's. So the
// kernels round exactly as the CPU does, and a host test (test_cuda_narrow) checks this very
// code against the CPU's over every input class. Include from .cu files and host tests; pulls
// in <cuda_runtime.h> for __host__ __device__.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/layouts.h"

namespace kvbench::narrow {

__host__ __device__ __forceinline__ uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

__host__ __device__ __forceinline__ float bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// float_to_half_bits: NaN -> sign | 0x7e00, 65520 and past -> infinity, subnormals kept.
__host__ __device__ __forceinline__ uint16_t half_bits(float x) {
  uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (u >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (u < 0x38800000u) {  // below 2^-14: steps of 2^-24, the scaling exact
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(rintf(bits_float(u) * 16777216.0f)));
  }
  uint32_t h = ((u >> 23) - 112) << 10 | (u & 0x7fffffu) >> 13;
  const uint32_t rest = u & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// float_to_bf16_bits: a NaN stays quiet (its payload never carries into infinity).
__host__ __device__ __forceinline__ uint16_t bf16_bits(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// float_to_e4m3: NaN -> 0x7f whatever its sign (the NaN x / scale makes is negative on x86
// and positive here), 448 and past (infinity too) saturate to sign | 0x7e.
__host__ __device__ __forceinline__ uint8_t e4m3_bits(float x) {
  uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7fu;
  const float a = bits_float(u);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7eu);
  if (a < 0.015625f) {  // below 2^-6: steps of 2^-9
    return static_cast<uint8_t>(sign | static_cast<uint32_t>(rintf(a * 512.0f)));
  }
  uint32_t c = ((u >> 23) - 120) << 3 | (u & 0x7fffffu) >> 20;
  const uint32_t rest = u & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (c & 1u))) ++c;
  return static_cast<uint8_t>(sign | (c < 0x7eu ? c : 0x7eu));
}

// Exact widenings.
__host__ __device__ __forceinline__ float half_value(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | mant << 13);
  if (exp != 0) return bits_float(sign | (exp + 112) << 23 | mant << 13);
  const float a = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact
  return bits_float(sign | float_bits(a));
}

__host__ __device__ __forceinline__ float bf16_value(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

__host__ __device__ __forceinline__ float e4m3_value(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xfu, mant = c & 7u;
  if (exp == 15 && mant == 7) return bits_float(sign | 0x7fc00000u);  // NaN
  if (exp == 0) return bits_float(sign | float_bits(static_cast<float>(mant) * 0.001953125f));
  return bits_float(sign | (exp + 120) << 23 | mant << 20);
}

// e4m3_row_scale over a row's largest magnitude: max |x| / 448, 1 for a row of zeros.
__host__ __device__ __forceinline__ float e4m3_scale(float amax) {
  return amax > 0.0f ? amax / 448.0f : 1.0f;
}

}  // namespace kvbench::narrow
