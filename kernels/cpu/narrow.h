// Narrow KV elements on the CPU (kernels/layouts.h, KvElement): fp32 rows rounded to fp16,
// bf16 or fp8 e4m3 as a narrow store holds them, and read back. Every conversion rounds to
// nearest, ties to even, as the CUDA intrinsics (__float2half_rn, __float2bfloat16_rn) and
// engines' casts do; the CUDA twin (kernels/cuda/narrow.h) is bit-identical.
#pragma once

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// fp32 -> IEEE fp16 bits: finite values past fp16's largest (65504) round to infinity,
// subnormals are kept, a NaN stays a NaN.
uint16_t float_to_half_bits(float x);

// fp32 -> e4m3 ("e4m3fn": 4 exponent bits, bias 7, 3 mantissa bits; no infinities, 0x7F and
// 0xFF are NaN): magnitudes past the largest, 448, saturate to it (as engines' scaled fp8
// casts do), subnormals (steps of 2^-9 below 2^-6) are kept; a NaN of either sign is 0x7F.
uint8_t float_to_e4m3(float x);
float e4m3_to_float(uint8_t code);  // exact

// The largest finite e4m3 magnitude: a row's scale maps its largest |x| there.
constexpr float kE4m3Max = 448.0f;

// fp8's row scale: max |x| / 448 over the row, 1 for a row of zeros.
float e4m3_row_scale(const float* x, int32_t n);

// Rounds n_rows rows of `dim` floats (row r at src + r * src_stride) into dst, rows of dim
// elements back to back; fp8 also writes each row's scale to scale[r] (unused otherwise).
void encode_kv_rows(KvElement element, const float* src, int64_t src_stride, int64_t n_rows,
                    int32_t dim, void* dst, float* scale);

// The values of n_rows narrow rows (src: rows of dim elements back to back; scale: fp8's row
// scales) into dst, rows of dim floats back to back. Exact for fp16 and bf16; for fp8 each
// value is the code's value times its row's scale, one rounding.
void decode_kv_rows(KvElement element, const void* src, const float* scale, int64_t n_rows,
                    int32_t dim, float* dst);

// Bytes of one stored row (one token of one KV head, keys or values): elements plus fp8's
// scale.
constexpr int64_t narrow_row_bytes(KvElement element, int32_t dim) {
  return static_cast<int64_t>(dim) * kv_element_bytes(element) +
         (element == KvElement::F8E4M3 ? static_cast<int64_t>(sizeof(float)) : 0);
}

}  // namespace kvbench
