// The model's linear layers on a GPU: fp32 GEMMs, and bf16 GEMMs accumulating in fp32,
// through cuBLAS. Host code (compiled by the
// C++ compiler, not nvcc); pulls in <cublas_v2.h> and <cuda_runtime.h>.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kvbench {

// Owns a cuBLAS handle, created on the current device with the default stream and the
// default (full fp32, no TF32) math mode. Move-only; a moved-from handle holds nothing.
class CublasHandle {
 public:
  CublasHandle();  // throws std::runtime_error naming cuBLAS's status
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }
  // Every later call on this handle is enqueued on `stream` (nullptr: the default stream).
  // Throws std::runtime_error naming cuBLAS's status.
  void set_stream(cudaStream_t stream);

 private:
  cublasHandle_t handle_ = nullptr;
};

// y [n, rows] = x [n, cols] . w [rows, cols]^T, all row-major fp32 device pointers,
// enqueued on the handle's stream (asynchronous). y is overwritten, never read (cols == 0
// gives zeros); it must not overlap w or x. Runs in the handle's math mode: CublasHandle's
// full fp32, so it agrees with a CPU fp32 GEMM to rounding (~1e-6 relative). Throws
// std::invalid_argument for sizes past cuBLAS's int range, std::runtime_error naming the
// call and the sizes on a cuBLAS or CUDA error.
void linear_cuda(cublasHandle_t handle, const float* w, int64_t rows, int64_t cols, const float* x,
                 int64_t n, float* y);

// linear_cuda with bf16 operands, as engines run a bf16 model: w [rows, cols] and
// x [n, cols] hold bf16 bits (kernels/cpu/layer_ops.h's float_to_bf16_bits), multiplied
// through cublasGemmEx with CUBLAS_COMPUTE_32F: each product is exact in fp32 and the sum
// accumulates in fp32. y [n, rows] stays fp32, unrounded: the caller adds a bias and rounds
// it to bf16 once (as a GEMM epilogue would), or keeps fp32 (the logits). Same sizes,
// errors and asynchrony as linear_cuda.
void linear_bf16_cuda(cublasHandle_t handle, const uint16_t* w, int64_t rows, int64_t cols,
                      const uint16_t* x, int64_t n, float* y);

}  // namespace kvbench
