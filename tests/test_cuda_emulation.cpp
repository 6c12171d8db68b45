// The host emulation of the CUDA runtime (kernels/emulated, KVBENCH_CUDA_EMULATION) stops at
// the mistakes a GPU would silently make: each one is run in a child process, which must abort
// with one line naming the call. And what it does emulate, it does right: poisoned memory,
// copies in each direction, cuBLAS's SGEMM and bf16 GemmEx against plain loops.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda_device.h"
#include "kernels/cpu/layer_ops.h"
#include "kernels/cuda/layer_ops.h"

namespace {

// Runs `mistake` in a forked child; returns what it wrote on stderr, and whether it aborted.
struct Death {
  bool aborted = false;
  std::string stderr_text;
};

Death run_in_child(const std::function<void()>& mistake) {
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    mistake();
    _exit(0);  // reached only when the emulation let it pass
  }
  close(pipe_fds[1]);
  Death d;
  char buf[512];
  for (ssize_t got; (got = read(pipe_fds[0], buf, sizeof buf)) > 0;) d.stderr_text.append(buf, got);
  close(pipe_fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  d.aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  return d;
}

void expect_abort(const std::function<void()>& mistake, const std::string& names) {
  const Death d = run_in_child(mistake);
  INFO(d.stderr_text);
  CHECK(d.aborted);
  CHECK(d.stderr_text.find("cuda emulation: " + names) != std::string::npos);
}

float* device_floats(size_t n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
  return static_cast<float*>(p);
}

}  // namespace

TEST_CASE("the emulation is one device whose fresh memory reads NaN", "[gpu]") {
  kvbench::testing::require_device();
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 1);
  float* d = device_floats(16);
  const auto host = kvbench::testing::download(d, 16);
  for (float x : host) CHECK(std::isnan(x));
  std::vector<float> values(16, 2.5f), back(16);
  REQUIRE(cudaMemcpy(d, values.data(), 64, cudaMemcpyHostToDevice) == cudaSuccess);
  float* e = nullptr;
  REQUIRE(cudaMallocAsync(reinterpret_cast<void**>(&e), 64, nullptr) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(e, d, 64, cudaMemcpyDeviceToDevice, nullptr) == cudaSuccess);
  REQUIRE(cudaMemcpy(back.data(), e, 64, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back == values);
  REQUIRE(cudaFreeAsync(e, nullptr) == cudaSuccess);
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("the emulation aborts on a copy in the wrong direction or out of bounds", "[gpu]") {
  kvbench::testing::require_device();
  float* d = device_floats(8);
  std::vector<float> host(16, 1.f);
  expect_abort([&] { cudaMemcpy(d, host.data(), 16 * sizeof(float), cudaMemcpyHostToDevice); },
               "cudaMemcpy: dst");
  expect_abort([&] { cudaMemcpy(d + 1, d, 4, cudaMemcpyHostToDevice); }, "cudaMemcpy");
  expect_abort([&] { cudaMemcpy(d, host.data(), 4, cudaMemcpyDeviceToHost); }, "cudaMemcpy");
  expect_abort([&] { cudaMemcpy(host.data(), d, 4, cudaMemcpyDeviceToDevice); }, "cudaMemcpy");
  expect_abort([&] { cudaMemcpy(host.data(), d, 4, cudaMemcpyDefault); }, "cudaMemcpy");
  // The last of 3 rows, 4 floats apart, runs past the 8 floats.
  expect_abort(
      [&] { cudaMemcpy2D(d, 16, host.data(), 16, 16, 3, cudaMemcpyHostToDevice); },
      "cudaMemcpy2D");
  expect_abort([&] { cudaMemsetAsync(d + 4, 0, 8 * sizeof(float), nullptr); },
               "cudaMemsetAsync");
  // Inside the bounds, the same calls go through.
  REQUIRE(cudaMemcpy2D(d, 16, host.data(), 16, 16, 2, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(d, 0, 8 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("the emulation aborts on a double free and on freeing host memory", "[gpu]") {
  kvbench::testing::require_device();
  expect_abort(
      [] {
        float* d = device_floats(4);
        cudaFree(d);
        cudaFree(d);
      },
      "cudaFree");
  std::vector<float> host(4);
  expect_abort([&] { cudaFree(host.data()); }, "cudaFree");
}

TEST_CASE("an emulated kernel aborts on a host pointer or a short buffer", "[gpu]") {
  kvbench::testing::require_device();
  float* d = device_floats(8);
  std::vector<float> host(8, 1.f);
  expect_abort([&] { kvbench::silu_mul_cuda(host.data(), d, d, 8, nullptr); },
               "silu_mul_cuda: gate");
  expect_abort([&] { kvbench::add_in_place_cuda(d, d, 9, nullptr); }, "add_in_place_cuda: x");
  REQUIRE(cudaFree(d) == cudaSuccess);
}

TEST_CASE("the emulated SGEMM and bf16 GemmEx compute what cuBLAS would", "[gpu]") {
  kvbench::testing::require_device();
  // y [n, rows] = x [n, cols] . w [rows, cols]^T, as linear_cuda asks cuBLAS (column-major).
  const int rows = 5, cols = 7, n = 3;
  std::vector<float> w(rows * cols), x(n * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.7f * i) * 3.f;
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.3f * i) * 2.f;
  kvbench::testing::Device<float> dw(w), dx(x), dy(std::vector<float>(n * rows));
  cublasHandle_t handle;
  REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
  const float one = 1.f, zero = 0.f;
  REQUIRE(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, dw.get(), cols,
                      dx.get(), cols, &zero, dy.get(), rows) == CUBLAS_STATUS_SUCCESS);
  const auto y = dy.host();
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < rows; ++i) {
      double want = 0;
      for (int c = 0; c < cols; ++c) want += double(x[r * cols + c]) * w[i * cols + c];
      CHECK(y[r * rows + i] == Approx(want).margin(1e-5));
    }
  }

  // bf16 inputs: the products of the rounded values, summed in fp32; a bf16 output rounded once.
  std::vector<uint16_t> wb(w.size()), xb(x.size());
  kvbench::fp32_to_bf16_cpu(w.data(), wb.data(), static_cast<int64_t>(w.size()));
  kvbench::fp32_to_bf16_cpu(x.data(), xb.data(), static_cast<int64_t>(x.size()));
  kvbench::testing::Device<uint16_t> dwb(wb), dxb(xb), dyb(std::vector<uint16_t>(n * rows));
  REQUIRE(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, dwb.get(),
                       CUDA_R_16BF, cols, dxb.get(), CUDA_R_16BF, cols, &zero, dy.get(),
                       CUDA_R_32F, rows, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, dwb.get(),
                       CUDA_R_16BF, cols, dxb.get(), CUDA_R_16BF, cols, &zero, dyb.get(),
                       CUDA_R_16BF, rows, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  const auto y32 = dy.host();
  const auto y16 = dyb.host();
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < rows; ++i) {
      double want = 0;
      for (int c = 0; c < cols; ++c) {
        want += double(kvbench::bf16_bits_to_float(xb[r * cols + c])) *
                kvbench::bf16_bits_to_float(wb[i * cols + c]);
      }
      CHECK(y32[r * rows + i] == Approx(want).margin(1e-5));
      CHECK(y16[r * rows + i] == kvbench::float_to_bf16_bits(y32[r * rows + i]));
    }
  }
  // A type pair cuBLAS lacks is refused, not guessed.
  CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, dw.get(), CUDA_R_32F,
                     cols, dx.get(), CUDA_R_32F, cols, &zero, dyb.get(), CUDA_R_16BF, rows,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  // A C too small for [rows, n] aborts.
  expect_abort(
      [&] {
        cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, rows, n + 1, cols, &one, dw.get(), cols,
                    dx.get(), cols, &zero, dy.get(), rows);
      },
      "cublasSgemm: B");
  REQUIRE(cublasDestroy(handle) == CUBLAS_STATUS_SUCCESS);
}
