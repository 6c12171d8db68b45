// y = W x for weights kept in their ggml block format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K,
// F32), decoding the blocks on the fly: decode reads ~4-8x fewer weight bytes than fp32 weights.
#pragma once

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// x: [n, cols], y: [n, rows]; n small (decode is n == 1). Threads over rows (OpenMP).
void block_matmul_cpu(const BlockMatrix& w, const float* x, float* y, int64_t n);

// Scalar reference: dequantize each row, then a double-accumulated dot product.
void block_matmul_reference(const BlockMatrix& w, const float* x, float* y, int64_t n);

}  // namespace kvbench
