// The CUDA twins of the block's per-token operations (kernels/cuda/layer_ops.h) against the
// CPU versions, bf16 conversion bit for bit against its CPU reference, and the cuBLAS linear
// layers (fp32, and bf16 with fp32 sums) against a double-precision product, on the same
// seeded inputs over odd sizes (rows 1, 3, 17; dims 63 and 576; head_dim 64 and 128;
// positions up to 8000). Without a CUDA device every case prints "no CUDA device: skipped"
// and exits 77 (ctest SKIP).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_device.h"
#include "kernels/cpu/layer_ops.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/linear.h"
#include "random_floats.h"

namespace {

using kvbench::bf16_bits_to_float;
using kvbench::testing::Device;
using kvbench::testing::random_floats;
using kvbench::testing::require_device;

constexpr int64_t kRows[] = {1, 3, 17};
constexpr int64_t kDims[] = {63, 576};

// Largest |a - b| / (1 + |b|): relative for large values, absolute near zero.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(double{a[i]} - b[i]) / (1.0 + std::fabs(double{b[i]})));
  }
  return worst;
}

// A non-default stream for the duration of a case: the kernels must honour `stream`. A
// blocking one, so its work waits for Device's copies on the default stream.
class Stream {
 public:
  Stream() { REQUIRE(cudaStreamCreate(&stream_) == cudaSuccess); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }
  void sync() const { REQUIRE(cudaStreamSynchronize(stream_) == cudaSuccess); }

 private:
  cudaStream_t stream_ = nullptr;
};

// Every case bf16 rounding has: random values over 2^-140..2^120 of both signs, exact
// bf16 values, ties either way, carries into the exponent, overflow to infinity, subnormals,
// infinities and NaNs (payloads in the low half too), and zeros.
std::vector<float> bf16_rounding_cases(int64_t n_random) {
  std::vector<float> x = random_floats(n_random, 11);
  for (int64_t i = 0; i < n_random; ++i) x[i] = std::ldexp(x[i], static_cast<int>(i % 261) - 140);
  for (const uint32_t bits :
       {0x3F800000u, 0x3F807FFFu, 0x3F808000u, 0x3F808001u, 0x3F818000u, 0xBF818000u,
        0x3FFFFFFFu, 0x7F7FFFFFu, 0x7F7F7FFFu, 0x7F7F8000u, 0x00018000u, 0x00008000u,
        0x0000C000u, 0x80000001u, 0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFF80FFFFu,
        0x7FC00000u, 0x00000000u, 0x80000000u}) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    x.push_back(f);
  }
  return x;
}

// a and b equal as bf16 results: the same bits, or both NaN (which NaN is not specified).
void check_same_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  REQUIRE(got.size() == want.size());
  int64_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool both_nan =
        std::isnan(bf16_bits_to_float(got[i])) && std::isnan(bf16_bits_to_float(want[i]));
    if (got[i] != want[i] && !both_nan) {
      if (mismatches++ < 5) {
        UNSCOPED_INFO("at " << i << ": " << std::hex << got[i] << " want " << want[i]);
      }
    }
  }
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("fp32_to_bf16_cuda and round_to_bf16_cuda equal the CPU reference bit for bit",
          "[gpu]") {
  require_device();
  Stream stream;
  for (const int64_t n_random : {0, 1, 17, 4097, 100003}) {
    INFO("random values " << n_random);
    const std::vector<float> x = bf16_rounding_cases(n_random);
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<uint16_t> want(x.size());
    kvbench::fp32_to_bf16_cpu(x.data(), want.data(), n);

    Device<float> dx(x);
    Device<uint16_t> dy(std::vector<uint16_t>(x.size(), 0xABCD));
    kvbench::fp32_to_bf16_cuda(dx.get(), dy.get(), n, stream.get());
    stream.sync();
    check_same_bf16(dy.host(), want);
    const std::vector<float> after = dx.host();  // the input is untouched (bytes: NaN != NaN)
    CHECK(std::memcmp(after.data(), x.data(), x.size() * sizeof(float)) == 0);

    // In place, held in fp32: the bf16 value in the upper half, zeros below.
    kvbench::round_to_bf16_cuda(dx.get(), n, stream.get());
    stream.sync();
    std::vector<uint16_t> upper, lower;
    for (const float f : dx.host()) {
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      upper.push_back(static_cast<uint16_t>(u >> 16));
      lower.push_back(static_cast<uint16_t>(u & 0xFFFF));
    }
    check_same_bf16(upper, want);
    int64_t nonzero_low = 0;
    for (size_t i = 0; i < lower.size(); ++i) nonzero_low += lower[i] != 0 && !std::isnan(x[i]);
    CHECK(nonzero_low == 0);
  }
}

TEST_CASE("rms_norm_cuda equals the CPU, out of place and in place", "[gpu]") {
  require_device();
  Stream stream;
  for (const int64_t rows : kRows) {
    for (const int64_t dim : kDims) {
      for (const float eps : {1e-5f, 1e-6f}) {
        INFO("rows " << rows << " dim " << dim << " eps " << eps);
        std::vector<float> x = random_floats(rows * dim, static_cast<uint32_t>(rows * dim));
        const std::vector<float> w = random_floats(dim, 2);
        // A zero row (eps alone in the root) and a large one (the scale far from 1).
        if (rows >= 3) {
          std::fill(x.begin() + dim, x.begin() + 2 * dim, 0.f);
          for (int64_t i = 2 * dim; i < 3 * dim; ++i) x[i] *= 1e3f;
        }
        std::vector<float> want(x.size());
        kvbench::rms_norm_cpu(x.data(), w.data(), want.data(), rows, dim, eps);

        Device<float> dx(x), dw(w), dy(std::vector<float>(x.size(), 99.f));
        kvbench::rms_norm_cuda(dx.get(), dw.get(), dy.get(), rows, dim, eps, stream.get());
        stream.sync();
        CHECK(max_rel_diff(dy.host(), want) < 1e-5);
        CHECK(dx.host() == x);  // the input is untouched

        kvbench::rms_norm_cuda(dx.get(), dw.get(), dx.get(), rows, dim, eps, nullptr);
        CHECK(max_rel_diff(dx.host(), want) < 1e-5);
      }
    }
  }
}

TEST_CASE("rope_interleaved_cuda equals the CPU up to position 8000", "[gpu]") {
  require_device();
  Stream stream;
  for (const int head_dim : {64, 128}) {
    for (const int n_heads : {9, 3}) {
      for (const int64_t n_tokens : kRows) {
        for (const float theta : {1e4f, 5e5f}) {
          INFO("head_dim " << head_dim << " heads " << n_heads << " tokens " << n_tokens
                           << " theta " << theta);
          // Out of order, from 0 to 8000 exactly (the first and last token).
          std::vector<int32_t> positions(n_tokens);
          for (int64_t t = 0; t < n_tokens; ++t) {
            positions[t] = static_cast<int32_t>((t * 4729) % 8001);
          }
          if (n_tokens > 1) positions.back() = 8000;
          std::vector<float> inv_freq(head_dim / 2);
          for (int i = 0; i < head_dim / 2; ++i) {
            inv_freq[i] = std::pow(theta, -2.f * static_cast<float>(i) / head_dim);
          }
          std::vector<float> x = random_floats(n_tokens * n_heads * head_dim,
                                               static_cast<uint32_t>(n_tokens * head_dim));
          Device<float> dx(x), df(inv_freq);
          Device<int32_t> dp(positions);
          kvbench::rope_interleaved_cpu(x.data(), positions.data(), n_tokens, n_heads, head_dim,
                                        inv_freq.data());
          kvbench::rope_interleaved_cuda(dx.get(), dp.get(), n_tokens, n_heads, head_dim,
                                         df.get(), stream.get());
          stream.sync();
          // Both take the angle in double and round its sine and cosine to float, so they
          // differ by a few fp32 roundings; a float angle would be ~5e-4 off at 8000.
          CHECK(max_rel_diff(dx.host(), x) < 1e-5);
        }
      }
    }
  }
}

TEST_CASE("silu_mul_cuda equals the CPU, also into gate or up", "[gpu]") {
  require_device();
  Stream stream;
  for (const int64_t rows : kRows) {
    for (const int64_t dim : kDims) {
      INFO("rows " << rows << " dim " << dim);
      const int64_t n = rows * dim;
      std::vector<float> gate = random_floats(n, 4), up = random_floats(n, 5);
      for (float& g : gate) g *= 8.f;  // reach silu's saturated tails
      std::vector<float> want(n);
      kvbench::silu_mul_cpu(gate.data(), up.data(), want.data(), n);

      Device<float> dg(gate), du(up), dout(std::vector<float>(n, 99.f));
      kvbench::silu_mul_cuda(dg.get(), du.get(), dout.get(), n, stream.get());
      stream.sync();
      CHECK(max_rel_diff(dout.host(), want) < 1e-5);

      kvbench::silu_mul_cuda(dg.get(), du.get(), du.get(), n, nullptr);
      CHECK(max_rel_diff(du.host(), want) < 1e-5);
      Device<float> du2(up);
      kvbench::silu_mul_cuda(dg.get(), du2.get(), dg.get(), n, nullptr);
      CHECK(max_rel_diff(dg.host(), want) < 1e-5);
    }
  }
}

TEST_CASE("add_in_place_cuda and add_bias_rows_cuda equal the CPU's float adds exactly", "[gpu]") {
  require_device();
  Stream stream;
  for (const int64_t rows : kRows) {
    for (const int64_t dim : kDims) {
      INFO("rows " << rows << " dim " << dim);
      const int64_t n = rows * dim;
      const std::vector<float> x = random_floats(n, 6), y = random_floats(n, 7);
      const std::vector<float> bias = random_floats(dim, 8);

      std::vector<float> sum(n), biased(n);
      for (int64_t i = 0; i < n; ++i) sum[i] = x[i] + y[i];
      for (int64_t i = 0; i < n; ++i) biased[i] = x[i] + bias[i % dim];

      Device<float> dx(x), dy(y), db(bias);
      kvbench::add_in_place_cuda(dx.get(), dy.get(), n, stream.get());
      stream.sync();
      CHECK(dx.host() == sum);
      CHECK(dy.host() == y);

      Device<float> dz(x);
      kvbench::add_bias_rows_cuda(dz.get(), db.get(), rows, dim, stream.get());
      stream.sync();
      CHECK(dz.host() == biased);
    }
  }
}

TEST_CASE("the layer ops accept empty sizes without touching memory", "[gpu]") {
  require_device();
  // Null pointers: an empty call must launch nothing that reads them.
  CHECK_NOTHROW(kvbench::rms_norm_cuda(nullptr, nullptr, nullptr, 0, 576, 1e-5f, nullptr));
  CHECK_NOTHROW(kvbench::rope_interleaved_cuda(nullptr, nullptr, 0, 9, 64, nullptr, nullptr));
  CHECK_NOTHROW(kvbench::silu_mul_cuda(nullptr, nullptr, nullptr, 0, nullptr));
  CHECK_NOTHROW(kvbench::add_in_place_cuda(nullptr, nullptr, 0, nullptr));
  CHECK_NOTHROW(kvbench::add_bias_rows_cuda(nullptr, nullptr, 0, 576, nullptr));
  CHECK_NOTHROW(kvbench::fp32_to_bf16_cuda(nullptr, nullptr, 0, nullptr));
  CHECK_NOTHROW(kvbench::round_to_bf16_cuda(nullptr, 0, nullptr));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

static_assert(!std::is_copy_constructible_v<kvbench::CublasHandle>);
static_assert(std::is_nothrow_move_constructible_v<kvbench::CublasHandle>);
static_assert(std::is_nothrow_move_assignable_v<kvbench::CublasHandle>);

TEST_CASE("linear_cuda equals a double-precision product", "[gpu]") {
  require_device();
  Stream stream;
  kvbench::CublasHandle cublas;
  cublas.set_stream(stream.get());
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape s : {Shape{576, 1536}, Shape{1536, 576}, Shape{33, 70}}) {
    for (const int64_t n : {1, 5, 37}) {
      INFO("w [" << s.rows << ", " << s.cols << "], n " << n);
      const std::vector<float> w = random_floats(s.rows * s.cols, 9);
      const std::vector<float> x = random_floats(n * s.cols, static_cast<uint32_t>(n));
      std::vector<float> want(n * s.rows);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t o = 0; o < s.rows; ++o) {
          double sum = 0;
          for (int64_t c = 0; c < s.cols; ++c) sum += double{x[r * s.cols + c]} * w[o * s.cols + c];
          want[r * s.rows + o] = static_cast<float>(sum);
        }
      }
      // y starts as NaN: the GEMM must overwrite it (beta 0), never read it.
      Device<float> dw(w), dx(x);
      Device<float> dy(std::vector<float>(want.size(), std::numeric_limits<float>::quiet_NaN()));
      kvbench::linear_cuda(cublas.get(), dw.get(), s.rows, s.cols, dx.get(), n, dy.get());
      stream.sync();
      CHECK(max_rel_diff(dy.host(), want) < 1e-4);
    }
  }
}

TEST_CASE("linear_bf16_cuda sums bf16 products in fp32, as a double product of the bf16 values",
          "[gpu]") {
  require_device();
  Stream stream;
  kvbench::CublasHandle cublas;
  cublas.set_stream(stream.get());
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape s : {Shape{576, 1536}, Shape{1536, 576}, Shape{33, 70}}) {
    for (const int64_t n : {1, 5, 37}) {
      INFO("w [" << s.rows << ", " << s.cols << "], n " << n);
      const std::vector<float> w = random_floats(s.rows * s.cols, 9);
      const std::vector<float> x = random_floats(n * s.cols, static_cast<uint32_t>(n));
      std::vector<uint16_t> w_bits(w.size()), x_bits(x.size());
      kvbench::fp32_to_bf16_cpu(w.data(), w_bits.data(), static_cast<int64_t>(w.size()));
      kvbench::fp32_to_bf16_cpu(x.data(), x_bits.data(), static_cast<int64_t>(x.size()));
      // The bf16 values multiplied exactly (8-bit mantissas: exact in double and in fp32),
      // and the same product of the unrounded fp32 values, which the GEMM must not give.
      std::vector<float> want(n * s.rows), unrounded(n * s.rows);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t o = 0; o < s.rows; ++o) {
          double sum = 0, sum_fp32 = 0;
          for (int64_t c = 0; c < s.cols; ++c) {
            sum += double{bf16_bits_to_float(x_bits[r * s.cols + c])} *
                   bf16_bits_to_float(w_bits[o * s.cols + c]);
            sum_fp32 += double{x[r * s.cols + c]} * w[o * s.cols + c];
          }
          want[r * s.rows + o] = static_cast<float>(sum);
          unrounded[r * s.rows + o] = static_cast<float>(sum_fp32);
        }
      }
      REQUIRE(max_rel_diff(unrounded, want) > 1e-3);  // the tolerance below tells them apart

      Device<uint16_t> dw(w_bits), dx(x_bits);
      Device<float> dy(std::vector<float>(want.size(), std::numeric_limits<float>::quiet_NaN()));
      kvbench::linear_bf16_cuda(cublas.get(), dw.get(), s.rows, s.cols, dx.get(), n, dy.get());
      stream.sync();
      // fp32 sums in cuBLAS's order: as linear_cuda's bound. A bf16 output would be ~2e-3 off.
      CHECK(max_rel_diff(dy.host(), want) < 1e-4);
    }
  }
}

TEST_CASE("linear_bf16_cuda: no inputs, and sizes past int", "[gpu]") {
  require_device();
  kvbench::CublasHandle cublas;
  const int64_t rows = 7, n = 3;
  Device<float> dy(std::vector<float>(rows * n, 5.f));
  Device<uint16_t> dummy(std::vector<uint16_t>(1, 0x3F80));
  kvbench::linear_bf16_cuda(cublas.get(), dummy.get(), rows, 0, dummy.get(), n, dy.get());
  CHECK(dy.host() == std::vector<float>(rows * n, 0.f));
  const int64_t too_big = int64_t{1} << 31;
  CHECK_THROWS_AS(
      kvbench::linear_bf16_cuda(cublas.get(), dummy.get(), 1, too_big, dummy.get(), 1, dy.get()),
      std::invalid_argument);
}

TEST_CASE("linear_cuda: a moved handle, no inputs, and sizes past int", "[gpu]") {
  require_device();
  kvbench::CublasHandle first;
  kvbench::CublasHandle second(std::move(first));
  CHECK(first.get() == nullptr);
  CHECK(second.get() != nullptr);
  kvbench::CublasHandle third;
  third = std::move(second);
  CHECK(second.get() == nullptr);

  // cols 0: the empty sum, zeros.
  const int64_t rows = 7, n = 3;
  Device<float> dy(std::vector<float>(rows * n, 5.f));
  Device<float> dummy(std::vector<float>(1, 1.f));
  kvbench::linear_cuda(third.get(), dummy.get(), rows, 0, dummy.get(), n, dy.get());
  CHECK(dy.host() == std::vector<float>(rows * n, 0.f));

  const int64_t too_big = int64_t{1} << 31;
  CHECK_THROWS_AS(
      kvbench::linear_cuda(third.get(), dummy.get(), too_big, 1, dummy.get(), 1, dy.get()),
      std::invalid_argument);
}
