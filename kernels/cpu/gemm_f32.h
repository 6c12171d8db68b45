// Y = X W^T in fp32 on a dequantized weight copy: the prefill GEMM of the fidelity
// reference (--prefill-activations fp32). OpenBLAS's sgemm, one call per OpenMP thread on
// its own slice of W's rows, so that one threading layer runs every kernel.
#pragma once

#include <cstdint>

namespace kvbench {

// OpenBLAS single-threaded, once per process: every BLAS call (this one, the emulated
// cuBLAS's) runs inside OpenMP's threads instead of a second pool spinning beside them.
void use_openmp_threads_only();

// y [n, rows] = x [n, cols] times w [rows, cols]^T.
void gemm_f32(const float* x, int64_t n, const float* w, int64_t rows, int64_t cols, float* y);

}  // namespace kvbench
