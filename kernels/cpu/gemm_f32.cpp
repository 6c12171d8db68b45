#include "kernels/cpu/gemm_f32.h"

#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>

namespace kvbench {

// One threading layer: OpenBLAS runs single-threaded and GEMMs are split over OpenMP
// threads, like every other kernel: two pools (OpenBLAS pthreads and OpenMP) spinning in
// turn on 2 cores made a 37-token prefill 3x slower. Looked up at run time
// so another BLAS (MKL, reference) still works, just with its own threading.
void use_openmp_threads_only() {
  using SetThreads = void (*)(int);
  static const bool done = [] {
    if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
      set(1);
    }
    return true;
  }();
  (void)done;
}

void gemm_f32(const float* x, int64_t n, const float* w, int64_t rows, int64_t cols, float* y) {
  use_openmp_threads_only();
  // Each thread multiplies x by its own slice of weight rows (output columns).
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), rows / 64));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int part = 0; part < threads; ++part) {
    const int64_t begin = rows * part / threads, end = rows * (part + 1) / threads;
    // y[:, begin:end] = x · w[begin:end, :]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                static_cast<int>(end - begin), static_cast<int>(cols), 1.0f, x,
                static_cast<int>(cols), w + begin * cols, static_cast<int>(cols), 0.0f, y + begin,
                static_cast<int>(rows));
  }
}

}  // namespace kvbench
