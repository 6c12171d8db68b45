#include "kernels/cuda/linear.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace kvbench {

namespace {

void check(cublasStatus_t status, const std::string& what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(what + ": " + cublasGetStatusString(status));
  }
}

}  // namespace

CublasHandle::CublasHandle() {
  check(cublasCreate(&handle_), "cublasCreate");
  // The default math mode keeps SGEMM in fp32 (TF32 tensor cores only when asked for).
  check(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

CublasHandle::~CublasHandle() {
  if (handle_) cublasDestroy(handle_);
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  std::swap(handle_, other.handle_);
  return *this;
}

void CublasHandle::set_stream(cudaStream_t stream) {
  check(cublasSetStream(handle_, stream), "cublasSetStream");
}

void linear_cuda(cublasHandle_t handle, const float* w, int64_t rows, int64_t cols, const float* x,
                 int64_t n, float* y) {
  if (n <= 0 || rows <= 0) return;
  // Column-major view of the row-major arrays: w is [cols, rows], x is [cols, n] and y is
  // [rows, n], so y = w^T x is one GEMM with w transposed.
  const float one = 1.f, zero = 0.f;
  check(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                    static_cast<int>(cols), &one, w, static_cast<int>(cols), x,
                    static_cast<int>(cols), &zero, y, static_cast<int>(rows)),
        "linear_cuda: cublasSgemm of [" + std::to_string(n) + ", " + std::to_string(cols) +
            "] x [" + std::to_string(rows) + ", " + std::to_string(cols) + "]^T");
}

}  // namespace kvbench
