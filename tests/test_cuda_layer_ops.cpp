// The CUDA twins of the block's per-token operations and the cuBLAS linear layer against
// the CPU versions on the same inputs, over odd sizes. Without a CUDA device every case
// prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda_device.h"
#include "kernels/cpu/layer_ops.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/linear.h"
#include "random_floats.h"

namespace {

using kvbench::testing::Device;
using kvbench::testing::random_floats;
using kvbench::testing::require_device;

// Largest |a - b| / (1 + |b|).
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(double{a[i]} - b[i]) / (1.0 + std::fabs(double{b[i]})));
  }
  return worst;
}

}  // namespace

TEST_CASE("rms_norm_cuda equals the CPU, also in place", "[gpu]") {
  require_device();
  for (const int64_t rows : {1, 3, 17}) {
    for (const int64_t dim : {63, 576}) {
      const std::vector<float> x = random_floats(rows * dim, 1), w = random_floats(dim, 2);
      std::vector<float> want(x.size());
      kvbench::rms_norm_cpu(x.data(), w.data(), want.data(), rows, dim, 1e-5f);
      Device<float> dx(x), dw(w), dy(std::vector<float>(x.size()));
      kvbench::rms_norm_cuda(dx.get(), dw.get(), dy.get(), rows, dim, 1e-5f, nullptr);
      CHECK(max_rel_diff(dy.host(), want) < 1e-5);
      kvbench::rms_norm_cuda(dx.get(), dw.get(), dx.get(), rows, dim, 1e-5f, nullptr);
      CHECK(max_rel_diff(dx.host(), want) < 1e-5);
    }
  }
}

TEST_CASE("rope_interleaved_cuda equals the CPU at long positions", "[gpu]") {
  require_device();
  for (const int head_dim : {64, 128}) {
    const int64_t n = 17;
    const int heads = 9;
    std::vector<int32_t> positions(n);
    for (int64_t t = 0; t < n; ++t) positions[t] = static_cast<int32_t>(t * 487);  // up to ~8K
    std::vector<float> inv_freq(head_dim / 2);
    for (int i = 0; i < head_dim / 2; ++i) inv_freq[i] = std::pow(10000.f, -2.f * i / head_dim);
    std::vector<float> x = random_floats(n * heads * head_dim, 3);
    Device<float> dx(x), df(inv_freq);
    Device<int32_t> dp(positions);
    kvbench::rope_interleaved_cpu(x.data(), positions.data(), n, heads, head_dim, inv_freq.data());
    kvbench::rope_interleaved_cuda(dx.get(), dp.get(), n, heads, head_dim, df.get(), nullptr);
    CHECK(max_rel_diff(dx.host(), x) < 1e-5);
  }
}

TEST_CASE("silu_mul, add and bias on the GPU equal the CPU", "[gpu]") {
  require_device();
  const int64_t rows = 5, dim = 1537;
  const std::vector<float> gate = random_floats(rows * dim, 4), up = random_floats(rows * dim, 5);
  const std::vector<float> bias = random_floats(dim, 6);
  std::vector<float> want(gate.size());
  kvbench::silu_mul_cpu(gate.data(), up.data(), want.data(), rows * dim);
  Device<float> dg(gate), du(up), db(bias);
  kvbench::silu_mul_cuda(dg.get(), du.get(), dg.get(), rows * dim, nullptr);
  CHECK(max_rel_diff(dg.host(), want) < 1e-5);

  kvbench::add_in_place_cuda(dg.get(), du.get(), rows * dim, nullptr);
  kvbench::add_bias_rows_cuda(dg.get(), db.get(), rows, dim, nullptr);
  for (int64_t i = 0; i < rows * dim; ++i) want[i] += up[i] + bias[i % dim];
  CHECK(max_rel_diff(dg.host(), want) < 1e-5);
}

TEST_CASE("linear_cuda equals a double-precision product", "[gpu]") {
  require_device();
  kvbench::CublasHandle cublas;
  struct Shape {
    int64_t rows, cols, n;
  };
  for (const Shape s : {Shape{576, 1536, 1}, Shape{1536, 576, 5}, Shape{33, 70, 37}}) {
    const std::vector<float> w = random_floats(s.rows * s.cols, 7), x = random_floats(s.n * s.cols, 8);
    std::vector<float> want(s.n * s.rows);
    for (int64_t r = 0; r < s.n; ++r) {
      for (int64_t o = 0; o < s.rows; ++o) {
        double sum = 0;
        for (int64_t c = 0; c < s.cols; ++c) sum += double{x[r * s.cols + c]} * w[o * s.cols + c];
        want[r * s.rows + o] = static_cast<float>(sum);
      }
    }
    Device<float> dw(w), dx(x), dy(std::vector<float>(want.size()));
    kvbench::linear_cuda(cublas.get(), dw.get(), s.rows, s.cols, dx.get(), s.n, dy.get());
    CHECK(max_rel_diff(dy.host(), want) < 1e-4);
  }
}
