// block_matmul_cpu and block_matmul_reference against an independent decoder of the ggml
// block formats, with error bounds derived from what each path rounds.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/block_matvec.h"

namespace {

using kvbench::BlockFormat;
using kvbench::BlockMatrix;

// Normal fp16 values only (exponent field 1..30), as the generator below makes.
double half_value(uint16_t h) {
  const int exp = (h >> 10) & 0x1F;
  const double v = std::ldexp(1.0 + (h & 0x3FF) / 1024.0, exp - 15);
  return (h & 0x8000) ? -v : v;
}

const char* name(BlockFormat f) {
  switch (f) {
    case BlockFormat::Q4_0:
      return "Q4_0";
    case BlockFormat::Q4_1:
      return "Q4_1";
    case BlockFormat::Q8_0:
      return "Q8_0";
    case BlockFormat::Q5_0:
      return "Q5_0";
    case BlockFormat::Q5_1:
      return "Q5_1";
    case BlockFormat::F32:
      return "F32";
  }
  return "?";
}

struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<double> dense;   // [rows, cols] decoded independently of the kernel file
  std::vector<double> scaled;  // [rows, cols] the part that multiplies x's int8 codes: q * d
  BlockMatrix m{};
};

uint16_t random_half(std::mt19937& rng, bool allow_negative) {
  const uint16_t exp = 9 + rng() % 5;  // 2^-6 .. 2^-2: scales of real quantized weights
  const uint16_t sign = allow_negative && (rng() & 1) ? 0x8000 : 0;
  return static_cast<uint16_t>(sign | (exp << 10) | (rng() & 0x3FF));
}

Weights make_weights(BlockFormat f, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Weights w;
  const int64_t nb = cols / 32;
  const int64_t row_bytes = nb * kvbench::block_format_bytes(f);
  w.bytes.resize(rows * row_bytes);
  w.dense.resize(rows * cols);
  w.scaled.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = w.bytes.data() + r * row_bytes + b * kvbench::block_format_bytes(f);
      double* out = w.dense.data() + r * cols + b * 32;
      if (f == BlockFormat::F32) {
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        for (int i = 0; i < 32; ++i) {
          const float x = uni(rng);
          std::memcpy(blk + 4 * i, &x, 4);
          out[i] = x;
        }
        continue;
      }
      const uint16_t d = random_half(rng, true);
      std::memcpy(blk, &d, 2);
      if (f == BlockFormat::Q8_0) {
        for (int i = 0; i < 32; ++i) {
          const int8_t q = static_cast<int8_t>(rng() & 0xFF);  // the full range, -128 included
          blk[2 + i] = static_cast<uint8_t>(q);
          out[i] = q * half_value(d);
        }
        continue;
      }
      const bool has_min = f == BlockFormat::Q4_1 || f == BlockFormat::Q5_1;
      const bool five_bit = f == BlockFormat::Q5_0 || f == BlockFormat::Q5_1;
      const uint16_t m = random_half(rng, true);
      if (has_min) std::memcpy(blk + 2, &m, 2);
      // Q5: the fifth bit of element e is bit e of a little-endian uint32 before the nibbles.
      const uint32_t fifth = five_bit ? static_cast<uint32_t>(rng()) : 0;
      uint8_t* fifth_bytes = blk + (has_min ? 4 : 2);
      if (five_bit) {
        for (int k = 0; k < 4; ++k) fifth_bytes[k] = static_cast<uint8_t>(fifth >> (8 * k));
      }
      const int header = (has_min ? 4 : 2) + (five_bit ? 4 : 0);
      const int zero = f == BlockFormat::Q4_0 ? 8 : f == BlockFormat::Q5_0 ? 16 : 0;
      for (int i = 0; i < 16; ++i) {
        const uint8_t byte = static_cast<uint8_t>(rng() & 0xFF);
        blk[header + i] = byte;
        // Elements i and i + 16.
        const int lo = (byte & 0x0F) | static_cast<int>(((fifth >> i) & 1) << 4);
        const int hi = (byte >> 4) | static_cast<int>(((fifth >> (i + 16)) & 1) << 4);
        if (!has_min) {
          out[i] = (lo - zero) * half_value(d);
          out[i + 16] = (hi - zero) * half_value(d);
        } else {
          out[i] = lo * half_value(d) + half_value(m);
          out[i + 16] = hi * half_value(d) + half_value(m);
        }
        w.scaled[r * cols + b * 32 + i] = lo * half_value(d);
        w.scaled[r * cols + b * 32 + i + 16] = hi * half_value(d);
      }
    }
  }
  if (f != BlockFormat::Q4_1 && f != BlockFormat::Q5_1) w.scaled = w.dense;
  w.m = BlockMatrix{w.bytes.data(), f, rows, cols, row_bytes};
  return w;
}

}  // namespace

TEST_CASE("block_matmul matches an independent decoder for every format", "[unit]") {
  for (BlockFormat f : {BlockFormat::F32, BlockFormat::Q4_0, BlockFormat::Q4_1, BlockFormat::Q8_0,
                        BlockFormat::Q5_0, BlockFormat::Q5_1}) {
    for (int64_t rows : {1, 3, 577}) {
      for (int64_t cols : {32, 576}) {
        for (int64_t n : {1, 2, 5}) {
          const Weights w = make_weights(f, rows, cols, static_cast<uint32_t>(rows * 7 + n));
          std::mt19937 rng(static_cast<uint32_t>(cols + n));
          std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
          std::vector<float> x(n * cols);
          for (auto& e : x) e = uni(rng);
          std::vector<float> y_ref(n * rows), y(n * rows);
          kvbench::block_matmul_reference(w.m, x.data(), y_ref.data(), n);
          kvbench::block_matmul_cpu(w.m, x.data(), y.data(), n);
          INFO(name(f) << " rows " << rows << " cols " << cols << " n " << n);
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t r = 0; r < rows; ++r) {
              double exact = 0.0, magnitude = 0.0;
              for (int64_t b = 0; b < cols / 32; ++b) {
                for (int e = 0; e < 32; ++e) {
                  const int64_t at = r * cols + b * 32 + e;
                  const double xv = x[i * cols + b * 32 + e];
                  exact += w.dense[at] * xv;
                  // Bounds every term's fp32 rounding, even where q * d + m cancels.
                  magnitude += (std::fabs(w.scaled[at]) + std::fabs(w.dense[at])) * std::fabs(xv);
                }
              }
              // Reference: fp32 dequantized weights summed in double: ~1e-7 relative rounding.
              CHECK(std::fabs(y_ref[i * rows + r] - exact) <= 1e-6 * magnitude + 1e-30);
              // Kernel: x stays fp32, so only fp32 accumulation error: 1e-5 of the term
              // magnitudes (576 terms, sums split over 8 lanes and per-block partials).
              CHECK(std::fabs(y[i * rows + r] - exact) <= 1e-5 * magnitude + 1e-30);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("block_matmul_cpu with a zero x block gives exact zeros", "[unit]") {
  // Exact: with x all zero every format's dot product (and Q4 offsets times sum(x)) is 0.
  for (BlockFormat f : {BlockFormat::Q4_0, BlockFormat::Q4_1, BlockFormat::Q8_0,
                        BlockFormat::Q5_0, BlockFormat::Q5_1}) {
    const Weights w = make_weights(f, 5, 64, 11);
    std::vector<float> x(64, 0.0f), y(5, 1.0f);
    kvbench::block_matmul_cpu(w.m, x.data(), y.data(), 1);
    for (float e : y) CHECK(e == 0.0f);
  }
}
