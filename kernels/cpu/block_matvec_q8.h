// y = W x as llama.cpp computes it on the CPU: x rounded to int8 per 32-value block (one
// fp32 scale each), then integer dot products against the weights' own codes. About 3x
// less arithmetic per weight than block_matvec.h's fp32 activations, so decode runs at the
// memory's pace; the price is x's rounding (|error| <= scale / 2 per value), which makes a
// token's logits differ between this path and a batched prefill's fp32 GEMM.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/layouts.h"

namespace kvbench {

// n rows of `cols` activations, each 32-value block as int8 codes with one scale:
// x ~= codes * scale, scale = max |x| / 127 over the block.
struct Q8Activations {
  int64_t n = 0;
  int64_t cols = 0;              // a multiple of 32
  std::vector<int8_t> codes;     // [n, cols]
  std::vector<float> scales;     // [n, cols / 32]
  std::vector<int32_t> sums;     // [n, cols / 32]: sum of each block's codes (for offsets)
};

// Rounds x [n, cols] to int8 per 32-value block; reuses out's buffers.
void quantize_activations_q8(const float* x, int64_t n, int64_t cols, Q8Activations* out);

// x: [n, w.cols] quantized, y: [n, w.rows]; n small (decode is n == 1). Every format but
// F32 (whose rows have no codes to take an integer dot product with). Threads over rows.
void block_matmul_q8(const BlockMatrix& w, const Q8Activations& x, float* y);

}  // namespace kvbench
