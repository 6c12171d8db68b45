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

namespace {

// The checks both dtypes share; false when y was filled without a GEMM (nothing to do, or
// zeros for an empty sum).
bool gemm_needed(cublasHandle_t handle, const char* who, int64_t rows, int64_t cols, int64_t n,
                 float* y) {
  if (n <= 0 || rows <= 0) return false;
  if (rows > INT_MAX || cols > INT_MAX || n > INT_MAX) {
    throw std::invalid_argument(std::string(who) + ": " + sizes(rows, cols, n) +
                                " exceeds cuBLAS's int sizes");
  }
  if (cols <= 0) {  // an empty sum; cuBLAS refuses a leading dimension of 0
    cudaStream_t stream = nullptr;
    check(cublasGetStream(handle, &stream), std::string(who) + ": cublasGetStream");
    const cudaError_t err = cudaMemsetAsync(y, 0, n * rows * sizeof(float), stream);
    if (err != cudaSuccess) {
      throw std::runtime_error(std::string(who) + ": cudaMemsetAsync of " + sizes(rows, cols, n) +
                               ": " + cudaGetErrorString(err));
    }
    return false;
  }
  return true;
}

}  // namespace

// cuBLAS is column-major: the same bytes read as w^T [cols, rows], x^T [cols, n] and
// y^T [rows, n], so y^T = w . x^T is one GEMM with the first operand transposed back.
void linear_cuda(cublasHandle_t handle, const float* w, int64_t rows, int64_t cols, const float* x,
                 int64_t n, float* y) {
  if (!gemm_needed(handle, "linear_cuda", rows, cols, n, y)) return;
  const float one = 1.f, zero = 0.f;  // host scalars: the handle's default pointer mode
  const int m = static_cast<int>(rows), k = static_cast<int>(cols), nn = static_cast<int>(n);
  check(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, w, k, x, k, &zero, y, m),
        "linear_cuda: cublasSgemm of " + sizes(rows, cols, n));
}

void linear_bf16_cuda(cublasHandle_t handle, const uint16_t* w, int64_t rows, int64_t cols,
                      const uint16_t* x, int64_t n, float* y) {
  if (!gemm_needed(handle, "linear_bf16_cuda", rows, cols, n, y)) return;
  const float one = 1.f, zero = 0.f;  // CUBLAS_COMPUTE_32F scales by host floats
  const int m = static_cast<int>(rows), k = static_cast<int>(cols), nn = static_cast<int>(n);
  check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, w, CUDA_R_16BF, k, x,
                     CUDA_R_16BF, k, &zero, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "linear_bf16_cuda: cublasGemmEx of bf16 " + sizes(rows, cols, n));
}

}  // namespace kvbench
