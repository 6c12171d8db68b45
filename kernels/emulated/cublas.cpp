// The cuBLAS calls kvbench makes, on the host: handles that hold a stream and a math mode,
// SGEMM through the host's BLAS (cblas_sgemm, as the CPU forward pass calls it), and
// GemmEx for bf16 inputs with fp32 accumulation: bf16 widened to fp32 exactly, products of two
// bf16 exact in fp32, fp32 sums, a bf16 output rounded to nearest even. Every matrix argument
// is checked to lie inside one live device allocation. Declarations are the real <cublas_v2.h>'s.
#include <cblas.h>
#include <cublas_v2.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <vector>

#include "kernels/cpu/layer_ops.h"  // bf16 rounding, as the model's bf16 mode
#include "kernels/emulated/device_memory.h"

// Opaque in the cuBLAS headers; the emulation's own.
struct cublasContext {
  cudaStream_t stream = nullptr;
  cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
};

namespace {

using kvbench::emulated::fail;
using kvbench::emulated::require_device;
using kvbench::emulated::require_device_array;

struct Handles {
  std::mutex mutex;
  std::set<cublasHandle_t> live;
};

Handles& handles() {
  static Handles* h = new Handles;
  return *h;
}

cublasContext* live(cublasHandle_t handle, const char* call) {
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  if (!h.live.count(handle)) fail(call, "not a live cuBLAS handle");
  return handle;
}

// Elements a column-major rows x cols operand spans with leading dimension ld.
int64_t extent(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (cols - 1) * ld + rows;
}

// The shape checks cuBLAS makes; the extents of op(A) [m, k], op(B) [k, n] and C [m, n].
struct GemmShape {
  int64_t a, b, c;
};

bool gemm_shape(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, int lda,
                int ldb, int ldc, GemmShape* s) {
  if (m < 0 || n < 0 || k < 0) return false;
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T)) {
    return false;  // conjugates mean nothing for real types; kvbench uses neither
  }
  const int64_t a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
  const int64_t b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
  if (lda < std::max<int64_t>(1, a_rows) || ldb < std::max<int64_t>(1, b_rows) ||
      ldc < std::max(1, m)) {
    return false;
  }
  s->a = extent(a_rows, a_cols, lda);
  s->b = extent(b_rows, b_cols, ldb);
  s->c = extent(m, n, ldc);
  return true;
}

CBLAS_TRANSPOSE cblas_op(cublasOperation_t op) {
  return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
}

// n bf16 values at p widened to fp32 (exact).
std::vector<float> widen(const void* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  const auto* h = static_cast<const uint16_t*>(p);
  for (int64_t i = 0; i < n; ++i) out[i] = kvbench::bf16_bits_to_float(h[i]);
  return out;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.live.insert(*handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  live(handle, "cublasDestroy");
  {
    Handles& h = handles();
    std::lock_guard<std::mutex> lock(h.mutex);
    h.live.erase(handle);
  }
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  live(handle, "cublasSetStream")->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  *stream = live(handle, "cublasGetStream")->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  live(handle, "cublasSetMathMode")->math_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  *mode = live(handle, "cublasGetMathMode")->math_mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN (CUDA emulation)";
  }
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown status (CUDA emulation)";
  }
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  live(handle, "cublasSgemm");
  GemmShape s;
  if (!gemm_shape(transa, transb, m, n, k, lda, ldb, ldc, &s)) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  require_device_array(A, k == 0 ? 0 : s.a, "cublasSgemm", "A");
  require_device_array(B, k == 0 ? 0 : s.b, "cublasSgemm", "B");
  require_device_array(C, s.c, "cublasSgemm", "C");
  cblas_sgemm(CblasColMajor, cblas_op(transa), cblas_op(transb), m, n, k, *alpha, A, lda, B, ldb,
              *beta, C, ldc);
  return CUBLAS_STATUS_SUCCESS;
}

// What kvbench's bf16 weights need: A and B both bf16 (or both fp32), C fp32 or bf16, fp32
// compute with host scalars. Anything else is CUBLAS_STATUS_NOT_SUPPORTED, as cuBLAS answers
// type combinations it lacks.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t /*algo: one way to compute here*/) {
  live(handle, "cublasGemmEx");
  const bool bf16_in = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF;
  const bool f32_in = Atype == CUDA_R_32F && Btype == CUDA_R_32F;
  const bool supported =
      (computeType == CUBLAS_COMPUTE_32F || computeType == CUBLAS_COMPUTE_32F_PEDANTIC) &&
      ((bf16_in && (Ctype == CUDA_R_32F || Ctype == CUDA_R_16BF)) ||
       (f32_in && Ctype == CUDA_R_32F));
  if (!supported) return CUBLAS_STATUS_NOT_SUPPORTED;
  GemmShape s;
  if (!gemm_shape(transa, transb, m, n, k, lda, ldb, ldc, &s)) return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  const int64_t in_size = bf16_in ? 2 : 4, out_size = Ctype == CUDA_R_16BF ? 2 : 4;
  require_device(A, k == 0 ? 0 : s.a * in_size, "cublasGemmEx", "A");
  require_device(B, k == 0 ? 0 : s.b * in_size, "cublasGemmEx", "B");
  require_device(C, s.c * out_size, "cublasGemmEx", "C");
  const float a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);

  std::vector<float> a32, b32;
  const float* ap = static_cast<const float*>(A);
  const float* bp = static_cast<const float*>(B);
  if (bf16_in) {
    a32 = widen(A, k == 0 ? 0 : s.a);
    b32 = widen(B, k == 0 ? 0 : s.b);
    ap = a32.data();
    bp = b32.data();
  }
  if (Ctype == CUDA_R_32F) {
    cblas_sgemm(CblasColMajor, cblas_op(transa), cblas_op(transb), m, n, k, a, ap, lda, bp, ldb,
                b, static_cast<float*>(C), ldc);
    return CUBLAS_STATUS_SUCCESS;
  }
  // bf16 C: fp32 sums, rounded once; C is read only when beta is not zero, as cuBLAS.
  std::vector<float> c32 = b != 0.f ? widen(C, s.c) : std::vector<float>(s.c, 0.f);
  cblas_sgemm(CblasColMajor, cblas_op(transa), cblas_op(transb), m, n, k, a, ap, lda, bp, ldb,
              b, c32.data(), ldc);
  auto* c = static_cast<uint16_t*>(C);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) c[j * ldc + i] = kvbench::float_to_bf16_bits(c32[j * ldc + i]);
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
