// Y = X W^T for many rows of X (a prefill chunk) with integer dot products: W repacked once
// from its GGUF blocks into 8-bit codes laid out for AVX-512 VNNI, X rounded to int8 per
// 32 values (Q8Activations, as block_matvec_q8.h and llama.cpp do). One vpdpbusd
// multiplies 16 weight rows by 4 values of one x row: 64 multiply-adds, where an fp32
// GEMM's FMA does 16.
//
// Every format becomes the same thing: a value is d * u + c per group of 32 elements (16
// for Q6_K, whose scales are per 16), u an unsigned code (Q8_0's shifted by 128), so a
// group's sum is dx * (d * sum(u * xcode) + c * sum(xcode)): the integer sum exact, the
// offset from x's code sums.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/block_matvec_q8.h"
#include "kernels/layouts.h"

namespace kvbench {

// W [rows, cols] in tiles of kQ8TileRows rows (the last one zero-padded). Per tile and
// 32-element block: codes as [4-byte group k = 0..7][row 0..15][4 codes] (one 64-byte
// vector per k), then `groups` scales d and offsets c for each of the 16 rows.
constexpr int64_t kQ8TileRows = 16;

struct PackedQ8Matrix {
  int64_t rows = 0;
  int64_t cols = 0;     // a multiple of 32
  int groups = 1;       // scale groups per 32-element block: 2 for Q6_K, 1 otherwise
  std::vector<uint8_t> codes;   // [tiles, cols / 32, 8, 16, 4]
  std::vector<float> scales;    // [tiles, cols / 32, groups, 16]
  std::vector<float> offsets;   // [tiles, cols / 32, groups, 16]

  bool empty() const { return rows == 0; }
  int64_t tiles() const { return (rows + kQ8TileRows - 1) / kQ8TileRows; }
};

// W's blocks repacked; every format but F32. Threads over tiles.
PackedQ8Matrix pack_q8(const BlockMatrix& w);

// The value of element (row, col) as the packed matrix holds it: d * u + c (tests).
float packed_q8_value(const PackedQ8Matrix& w, int64_t row, int64_t col);

// y [x.n, w.rows] = x W^T. With AVX-512 VNNI the tiled kernel; without it, gemm_q8_reference.
// Both compute every sum in the same order: the same floats, bit for bit.
void gemm_q8(const PackedQ8Matrix& w, const Q8Activations& x, float* y);

// The portable loops that define gemm_q8's result.
void gemm_q8_reference(const PackedQ8Matrix& w, const Q8Activations& x, float* y);

// True when this build has the VNNI kernel (compiled for a CPU with AVX-512 VNNI).
bool gemm_q8_uses_vnni();

}  // namespace kvbench
