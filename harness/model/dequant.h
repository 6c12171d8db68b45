// Dequantization of ggml block formats to float32, bit-exact with ggml's reference
// dequantize_row_* functions (ggml-quants.c).
#pragma once

#include <cstdint>

#include "harness/model/gguf.h"

namespace kvbench {

// Writes n floats decoded from `src` (n must be a multiple of the type's block size).
// Throws InputError for a type kvbench does not support.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Half-precision helpers shared by the dequantizers and the quantized kernels.
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even
float bf16_to_fp32(uint16_t h);

}  // namespace kvbench
