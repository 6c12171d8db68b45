// block_matmul_cpu and block_matmul_reference against an independent decoder (K-quants: an
// independent packer) of the ggml block formats, with error bounds derived from what each
// path rounds, and exactly against dequantize_row on one-hot x rows.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "harness/model/dequant.h"
#include "kernels/cpu/block_layout.h"
#include "kernels/cpu/block_matvec.h"
#include "kernels/cpu/block_matvec_q8.h"
#include "kernels/cpu/gemm_q8.h"

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
    case BlockFormat::Q4_K:
      return "Q4_K";
    case BlockFormat::Q6_K:
      return "Q6_K";
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

// K-quant super-blocks are built the other way round from the kernel: draw each element's
// code and each sub-block's scale, then pack them as ggml's quantize_row_q4_K / _q6_K lay
// them out. `out` and `scaled` get 256 values.
void make_q4_k_block(std::mt19937& rng, uint8_t* blk, double* out, double* scaled) {
  const uint16_t d = random_half(rng, true);
  const uint16_t dmin = random_half(rng, true);
  std::memcpy(blk, &d, 2);
  std::memcpy(blk + 2, &dmin, 2);
  int sc[8], mn[8], q[256];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<int>(rng() % 64);
    mn[j] = static_cast<int>(rng() % 64);
  }
  for (int& c : q) c = static_cast<int>(rng() % 16);
  uint8_t* scales = blk + 4;
  std::memset(scales, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] = static_cast<uint8_t>(sc[j]);
      scales[j + 4] = static_cast<uint8_t>(mn[j]);
    } else {
      scales[j + 4] = static_cast<uint8_t>((sc[j] & 0x0F) | (mn[j] & 0x0F) << 4);
      scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
    }
  }
  // Each 64 elements share 32 bytes: the first 32 in the low nibbles, the next in the high.
  uint8_t* qs = blk + 16;
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
  }
  for (int e = 0; e < 256; ++e) {
    scaled[e] = half_value(d) * sc[e / 32] * q[e];
    out[e] = scaled[e] - half_value(dmin) * mn[e / 32];
  }
}

void make_q6_k_block(std::mt19937& rng, uint8_t* blk, double* out, double* scaled) {
  int q[256];
  for (int& c : q) c = static_cast<int>(rng() % 64);
  int8_t scales[16];
  for (int8_t& v : scales) v = static_cast<int8_t>(rng() & 0xFF);
  const uint16_t d = random_half(rng, true);
  // Each 128 elements: ql[l] holds elements l (low nibble) and l + 64 (high), ql[l + 32]
  // elements l + 32 and l + 96; qh[l] holds the top two bits of l, l + 32, l + 64, l + 96.
  uint8_t* ql = blk;
  uint8_t* qh = blk + 128;
  for (int h = 0; h < 2; ++h) {
    const int* v = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[64 * h + l] = static_cast<uint8_t>((v[l] & 0x0F) | (v[l + 64] & 0x0F) << 4);
      ql[64 * h + l + 32] = static_cast<uint8_t>((v[l + 32] & 0x0F) | (v[l + 96] & 0x0F) << 4);
      qh[32 * h + l] = static_cast<uint8_t>((v[l] >> 4) | (v[l + 32] >> 4) << 2 |
                                            (v[l + 64] >> 4) << 4 | (v[l + 96] >> 4) << 6);
    }
  }
  std::memcpy(blk + 192, scales, 16);
  std::memcpy(blk + 208, &d, 2);
  for (int e = 0; e < 256; ++e) out[e] = scaled[e] = half_value(d) * scales[e / 16] * (q[e] - 32);
}

Weights make_weights(BlockFormat f, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Weights w;
  const int64_t block = kvbench::block_format_elements(f);
  const int64_t nb = cols / block;
  const int64_t row_bytes = nb * kvbench::block_format_bytes(f);
  w.bytes.resize(rows * row_bytes);
  w.dense.resize(rows * cols);
  w.scaled.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = w.bytes.data() + r * row_bytes + b * kvbench::block_format_bytes(f);
      double* out = w.dense.data() + r * cols + b * block;
      if (f == BlockFormat::Q4_K || f == BlockFormat::Q6_K) {
        double* scaled = w.scaled.data() + r * cols + b * block;
        (f == BlockFormat::Q4_K ? make_q4_k_block : make_q6_k_block)(rng, blk, out, scaled);
        continue;
      }
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
  if (f != BlockFormat::Q4_1 && f != BlockFormat::Q5_1 && f != BlockFormat::Q4_K) {
    w.scaled = w.dense;
  }
  w.m = BlockMatrix{w.bytes.data(), f, rows, cols, row_bytes};
  return w;
}

}  // namespace

constexpr BlockFormat kAllFormats[] = {BlockFormat::F32,  BlockFormat::Q4_0, BlockFormat::Q4_1,
                                       BlockFormat::Q8_0, BlockFormat::Q5_0, BlockFormat::Q5_1,
                                       BlockFormat::Q4_K, BlockFormat::Q6_K};

TEST_CASE("block_matmul matches an independent decoder for every format", "[unit]") {
  // Rows 577 split unevenly over the threads; n = 5 takes a pass of 4 x rows and one of 1.
  for (BlockFormat f : kAllFormats) {
    for (int64_t rows : {1, 3, 17, 577}) {
      for (int64_t blocks : {1, 2, 5, 18}) {
        const int64_t cols = blocks * kvbench::block_format_elements(f);
        for (int64_t n : {1, 2, 3, 4, 5}) {
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
              for (int64_t c = 0; c < cols; ++c) {
                const int64_t at = r * cols + c;
                const double xv = x[i * cols + c];
                exact += w.dense[at] * xv;
                // Bounds every term's fp32 rounding, even where q * d + m cancels.
                magnitude += (std::fabs(w.scaled[at]) + std::fabs(w.dense[at])) * std::fabs(xv);
              }
              // Reference: fp32 dequantized weights summed in double: ~1e-7 relative rounding.
              CHECK(std::fabs(y_ref[i * rows + r] - exact) <= 1e-6 * magnitude + 1e-30);
              // Kernel: x stays fp32, so only fp32 accumulation error: 1e-5 of the term
              // magnitudes (up to 4608 terms, sums split over 8 lanes and per-block partials).
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
  for (BlockFormat f : kAllFormats) {
    const int64_t cols = 2 * kvbench::block_format_elements(f);
    const Weights w = make_weights(f, 5, cols, 11);
    std::vector<float> x(cols, 0.0f), y(5, 1.0f);
    kvbench::block_matmul_cpu(w.m, x.data(), y.data(), 1);
    for (float e : y) CHECK(e == 0.0f);
  }
}

TEST_CASE("block_matmul with one-hot x rows gives dequantize_row's values exactly", "[unit]") {
  // W times the identity is W's columns: each output is one decoded weight plus exact zeros
  // (q * d and the offsets are exact in fp32, so one rounding, as in ggml's dequantizer).
  // dequantize_row is checked bit for bit against gguf-py, so this ties the kernels' reading
  // of every layout to ggml's.
  const std::pair<BlockFormat, kvbench::GgmlType> formats[] = {
      {BlockFormat::Q4_0, kvbench::GgmlType::Q4_0}, {BlockFormat::Q4_1, kvbench::GgmlType::Q4_1},
      {BlockFormat::Q8_0, kvbench::GgmlType::Q8_0}, {BlockFormat::Q5_0, kvbench::GgmlType::Q5_0},
      {BlockFormat::Q5_1, kvbench::GgmlType::Q5_1}, {BlockFormat::Q4_K, kvbench::GgmlType::Q4_K},
      {BlockFormat::Q6_K, kvbench::GgmlType::Q6_K}};
  for (const auto& [f, type] : formats) {
    INFO(name(f));
    const int64_t rows = 3, cols = 2 * kvbench::block_format_elements(f);
    const Weights w = make_weights(f, rows, cols, 23);
    std::vector<float> identity(cols * cols, 0.0f);
    for (int64_t c = 0; c < cols; ++c) identity[c * cols + c] = 1.0f;
    std::vector<float> y(cols * rows), y_ref(cols * rows), row(cols);
    kvbench::block_matmul_cpu(w.m, identity.data(), y.data(), cols);
    kvbench::block_matmul_reference(w.m, identity.data(), y_ref.data(), cols);
    int mismatches = 0;
    for (int64_t r = 0; r < rows; ++r) {
      kvbench::dequantize_row(type, w.bytes.data() + r * w.m.row_bytes, row.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        // == rather than bits: an exact zero may come out as -0 from ggml and +0 from a sum.
        if ((y[c * rows + r] != row[c] || y_ref[c * rows + r] != row[c]) && mismatches++ < 5) {
          FAIL_CHECK("row " << r << " col " << c << ": kernel " << y[c * rows + r] << " reference "
                            << y_ref[c * rows + r] << " dequantize_row " << row[c]);
        }
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("quantize_activations_q8 rounds each 32-value block to int8 codes and one scale",
          "[unit]") {
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> uni(-3.0f, 3.0f);
  const int64_t n = 3, cols = 96;
  std::vector<float> x(n * cols);
  for (auto& e : x) e = uni(rng);
  for (int64_t c = 32; c < 64; ++c) x[cols + c] = 0.0f;  // an all-zero block
  kvbench::Q8Activations q;
  kvbench::quantize_activations_q8(x.data(), n, cols, &q);
  REQUIRE(q.codes.size() == static_cast<size_t>(n * cols));
  REQUIRE(q.scales.size() == static_cast<size_t>(n * cols / 32));
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    float amax = 0.0f;
    int32_t sum = 0, code_max = 0;
    for (int64_t e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[b * 32 + e]));
    CHECK(q.scales[b] == amax / 127.0f);
    for (int64_t e = 0; e < 32; ++e) {
      const int32_t code = q.codes[b * 32 + e];
      sum += code;
      code_max = std::max(code_max, std::abs(code));
      // Nearest code: within half a step (and a little fp32 slack in x / scale).
      CHECK(std::fabs(x[b * 32 + e] - code * q.scales[b]) <= 0.5001f * q.scales[b]);
    }
    CHECK(q.sums[b] == sum);
    CHECK(code_max == (amax > 0.0f ? 127 : 0));
  }
}

TEST_CASE("block_matmul_q8 is W times x's int8 rounding, for every block format", "[unit]") {
  // Exact expectation: the independently decoded weights times the rounded x (codes *
  // scale) in double; the kernel's integer sums are exact, so only fp32 scaling and
  // accumulation remain.
  for (BlockFormat f : kAllFormats) {
    if (f == BlockFormat::F32) continue;
    for (int64_t rows : {1, 17, 577}) {
      for (int64_t blocks : {1, 2, 5, 18}) {
        const int64_t cols = blocks * kvbench::block_format_elements(f);
        for (int64_t n : {1, 2, 4, 5}) {
          const Weights w = make_weights(f, rows, cols, static_cast<uint32_t>(rows * 5 + n));
          std::mt19937 rng(static_cast<uint32_t>(cols * 3 + n));
          std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
          std::vector<float> x(n * cols);
          for (auto& e : x) e = uni(rng);
          kvbench::Q8Activations q;
          kvbench::quantize_activations_q8(x.data(), n, cols, &q);
          std::vector<float> y(n * rows);
          kvbench::block_matmul_q8(w.m, q, y.data());
          INFO(name(f) << " rows " << rows << " cols " << cols << " n " << n);
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t r = 0; r < rows; ++r) {
              double exact = 0.0, magnitude = 0.0;
              for (int64_t c = 0; c < cols; ++c) {
                const int64_t at = r * cols + c;
                const double xv = static_cast<double>(q.codes[i * cols + c]) *
                                  q.scales[(i * cols + c) / 32];
                exact += w.dense[at] * xv;
                magnitude += (std::fabs(w.scaled[at]) + std::fabs(w.dense[at])) * std::fabs(xv);
              }
              CHECK(std::fabs(y[i * rows + r] - exact) <= 1e-5 * magnitude + 1e-30);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("pack_q8 holds every weight as the independent decoder values it", "[unit]") {
  for (BlockFormat f : kAllFormats) {
    if (f == BlockFormat::F32) continue;
    for (int64_t rows : {1, 16, 17, 40}) {
      const int64_t cols = 2 * kvbench::block_format_elements(f);
      const Weights w = make_weights(f, rows, cols, static_cast<uint32_t>(rows + 11));
      const kvbench::PackedQ8Matrix p = kvbench::pack_q8(w.m);
      INFO(name(f) << " rows " << rows);
      CHECK(p.rows == rows);
      CHECK(p.groups == (f == BlockFormat::Q6_K ? 2 : 1));
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const double exact = w.dense[r * cols + c];
          // d * u + c against d * (q - z) (+ m): one rounding of each product and sum.
          const double bound = 1e-6 * (std::fabs(exact) + std::fabs(w.scaled[r * cols + c]) +
                                       64.0 * std::fabs(w.dense[r * cols]) + 1e-3);
          CHECK(std::fabs(kvbench::packed_q8_value(p, r, c) - exact) <= bound);
        }
      }
    }
  }
}

TEST_CASE("gemm_q8 is W times x's int8 rounding, the same floats as its reference",
          "[unit]") {
  for (BlockFormat f : kAllFormats) {
    if (f == BlockFormat::F32) continue;
    for (int64_t rows : {1, 17, 48}) {
      for (int64_t blocks : {1, 3}) {
        const int64_t cols = blocks * kvbench::block_format_elements(f);
        for (int64_t n : {1, 5, 8, 9, 21}) {
          const Weights w = make_weights(f, rows, cols, static_cast<uint32_t>(rows * 7 + n));
          const kvbench::PackedQ8Matrix p = kvbench::pack_q8(w.m);
          std::mt19937 rng(static_cast<uint32_t>(cols * 5 + n));
          std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
          std::vector<float> x(n * cols);
          for (auto& e : x) e = uni(rng);
          kvbench::Q8Activations q;
          kvbench::quantize_activations_q8(x.data(), n, cols, &q);
          // NaN-filled: a row the kernel forgets to write fails every comparison.
          std::vector<float> y(n * rows, std::nanf("")), reference(n * rows, std::nanf(""));
          kvbench::gemm_q8(p, q, y.data());
          kvbench::gemm_q8_reference(p, q, reference.data());
          INFO(name(f) << " rows " << rows << " cols " << cols << " n " << n
                       << (kvbench::gemm_q8_uses_vnni() ? " (VNNI)" : " (reference)"));
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t r = 0; r < rows; ++r) {
              double exact = 0.0, magnitude = 0.0;
              for (int64_t c = 0; c < cols; ++c) {
                const int64_t at = r * cols + c;
                const double xv = static_cast<double>(q.codes[i * cols + c]) *
                                  q.scales[(i * cols + c) / 32];
                exact += w.dense[at] * xv;
                // d * u and the offset c cancel: each is at most about twice the block's
                // largest |value| (Q8_0's u = q + 128), which bounds what is rounded.
                double block_max = 0.0;
                for (int64_t e = c / 32 * 32; e < c / 32 * 32 + 32; ++e) {
                  block_max = std::max(block_max, std::fabs(w.dense[r * cols + e]));
                }
                magnitude += 3.0 * block_max * std::fabs(xv);
              }
              const float got = y[i * rows + r];
              CHECK(std::memcmp(&got, &reference[i * rows + r], sizeof(float)) == 0);
              CHECK(std::fabs(got - exact) <= 1e-5 * magnitude + 1e-30);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("pack_q8 at the format's width holds the same values in about the GGUF's bytes, and "
          "gemm_q8 on it gives the byte packing's floats, each row as alone",
          "[unit]") {
  for (BlockFormat f : kAllFormats) {
    if (f == BlockFormat::F32) continue;
    for (int64_t rows : {1, 17, 48}) {
      for (int64_t blocks : {1, 3}) {
        const int64_t cols = blocks * kvbench::block_format_elements(f);
        const Weights w = make_weights(f, rows, cols, static_cast<uint32_t>(rows * 3 + blocks));
        const kvbench::PackedQ8Matrix bytes = kvbench::pack_q8(w.m);
        const kvbench::PackedQ8Matrix narrow = kvbench::pack_q8(w.m, kvbench::CodeWidth::Format);
        INFO(name(f) << " rows " << rows << " cols " << cols
                     << (kvbench::gemm_q8_uses_vnni() ? " (VNNI)" : " (reference)"));
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const float a = kvbench::packed_q8_value(bytes, r, c);
            const float b = kvbench::packed_q8_value(narrow, r, c);
            REQUIRE(std::memcmp(&a, &b, sizeof(float)) == 0);
          }
        }
        // Per 16-row tile: the GGUF blocks' bytes, plus at most 3% (Q4_K's 6-bit scales and
        // mins kept in a byte each: 148 bytes a super-block row against 144).
        const double gguf = static_cast<double>(kvbench::block_format_bytes(f)) * cols /
                            kvbench::block_format_elements(f) * narrow.tiles() * 16;
        CHECK(static_cast<double>(narrow.bytes()) <= 1.03 * gguf);
        CHECK(narrow.bytes() < bytes.bytes());
        for (int64_t n : {1, 2, 5, 8, 9}) {
          std::mt19937 rng(static_cast<uint32_t>(cols * 11 + n));
          std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
          std::vector<float> x(n * cols);
          for (auto& e : x) e = uni(rng);
          kvbench::Q8Activations q;
          kvbench::quantize_activations_q8(x.data(), n, cols, &q);
          std::vector<float> y(n * rows, std::nanf("")), reference(n * rows, std::nanf(""));
          kvbench::gemm_q8(narrow, q, y.data());
          kvbench::gemm_q8_reference(bytes, q, reference.data());
          CHECK(std::memcmp(y.data(), reference.data(), y.size() * sizeof(float)) == 0);
          // Each x row alone gives its row of the batch, bit for bit.
          for (int64_t i = 0; i < n; ++i) {
            kvbench::Q8Activations one;
            kvbench::quantize_activations_q8(x.data() + i * cols, 1, cols, &one);
            std::vector<float> alone(rows, std::nanf(""));
            kvbench::gemm_q8(narrow, one, alone.data());
            CHECK(std::memcmp(alone.data(), y.data() + i * rows, rows * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("q4_k_scales_mins unpacks every pair as q4_k_scale_min does", "[unit]") {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 20000; ++trial) {
    uint8_t s[12];
    for (auto& b : s) b = static_cast<uint8_t>(rng());
    uint64_t scales, mins;
    kvbench::block_layout::q4_k_scales_mins(s, &scales, &mins);
    for (int j = 0; j < 8; ++j) {
      int scale, min;
      kvbench::block_layout::q4_k_scale_min(j, s, &scale, &min);
      CHECK(static_cast<int>((scales >> (8 * j)) & 0xFF) == scale);
      CHECK(static_cast<int>((mins >> (8 * j)) & 0xFF) == min);
    }
  }
}
