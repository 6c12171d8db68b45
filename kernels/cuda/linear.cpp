#include "kernels/cuda/linear.h"

#include <climits>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvbench {

namespace {

void check(cublasStatus_t status, const std::string& what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(what + ": " + cublasGetStatusName(status) + " (" +
                             cublasGetStatusString(status) + ")");
  }
}

std::string sizes(int64_t rows, int64_t cols, int64_t n) {
  return "x [" + std::to_string(n) + ", " + std::to_string(cols) + "] . w [" +
         std::to_string(rows) + ", " + std::to_string(cols) + "]^T";
}

}  // namespace

CublasHandle::CublasHandle() {
  check(cublasCreate(&handle_), "cublasCreate");
  // Explicit, though it is cuBLAS's default: SGEMM stays fp32 (TF32 only when asked for),
  // so the GPU forward agrees with the CPU's.
  check(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}

CublasHandle::~CublasHandle() {
  if (handle_) cublasDestroy(handle_);
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_) cublasDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void CublasHandle::set_stream(cudaStream_t stream) {
  check(cublasSetStream(handle_, stream), "cublasSetStream");
}

void linear_cuda(cublasHandle_t handle, const float* w, int64_t rows, int64_t cols, const float* x,
                 int64_t n, float* y) {
  if (n <= 0 || rows <= 0) return;
  if (rows > INT_MAX || cols > INT_MAX || n > INT_MAX) {
    throw std::invalid_argument("linear_cuda: " + sizes(rows, cols, n) +
                                " exceeds cuBLAS's int sizes");
  }
  if (cols <= 0) {  // an empty sum; cuBLAS refuses a leading dimension of 0
    cudaStream_t stream = nullptr;
    check(cublasGetStream(handle, &stream), "linear_cuda: cublasGetStream");
    const cudaError_t err = cudaMemsetAsync(y, 0, n * rows * sizeof(float), stream);
    if (err != cudaSuccess) {
      throw std::runtime_error("linear_cuda: cudaMemsetAsync of " + sizes(rows, cols, n) + ": " +
                               cudaGetErrorString(err));
    }
    return;
  }
  // cuBLAS is column-major: the same bytes read as w^T [cols, rows], x^T [cols, n] and
  // y^T [rows, n], so y^T = w . x^T is one GEMM with the first operand transposed back.
  const float one = 1.f, zero = 0.f;  // host scalars: the handle's default pointer mode
  const int m = static_cast<int>(rows), k = static_cast<int>(cols), nn = static_cast<int>(n);
  check(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, w, k, x, k, &zero, y, m),
        "linear_cuda: cublasSgemm of " + sizes(rows, cols, n));
}

}  // namespace kvbench
