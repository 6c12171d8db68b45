// The model's linear layers on a GPU: fp32 GEMMs through cuBLAS. Host code; pulls in
// <cublas_v2.h>.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

namespace kvbench {

// Owns a cuBLAS handle (created on the current device, on the default stream).
class CublasHandle {
 public:
  CublasHandle();  // throws std::runtime_error naming cuBLAS's status
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }
  void set_stream(cudaStream_t stream);

 private:
  cublasHandle_t handle_ = nullptr;
};

// y [n, rows] = x [n, cols] . w [rows, cols]^T, all row-major fp32 device pointers, on the
// handle's stream. Full fp32 (no TF32), so it agrees with the CPU GEMM to rounding. Throws
// std::runtime_error naming the sizes on a cuBLAS error.
void linear_cuda(cublasHandle_t handle, const float* w, int64_t rows, int64_t cols, const float* x,
                 int64_t n, float* y);

}  // namespace kvbench
