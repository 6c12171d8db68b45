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

// How wide the packed codes are. Byte: every code in a byte, scales and offsets as floats:
// the layout above, 1.25 bytes a weight, the fewest instructions a block (prefill GEMMs).
// Format: as narrow as the GGUF format's own codes, so that a product of few x rows (decode)
// streams about the GGUF file's bytes: 4-bit codes two to a byte (vector j of a block holds
// groups j and j + 4 in its low and high nibbles), a fifth and sixth bit as 64-bit masks per
// group, and scales and offsets in half precision where the format's own are (Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0) or left out where they are -zero * d (Q4_0, Q5_0, Q8_0, Q6_K). The
// values, and so every product, are the same in both widths, bit for bit. The K formats keep
// their sub-block scales (and Q4_K its mins) as the file's small integers beside one half
// super-block scale per 256 elements, multiplied in the kernel: an exact product, so the
// floats are the byte-wide packing's, for 0.58 (Q4_K) and 0.82 (Q6_K) bytes a weight where
// floats took 0.75 and 1.0.
enum class CodeWidth { Byte, Format };

struct PackedQ8Matrix {
  int64_t rows = 0;
  int64_t cols = 0;     // a multiple of 32
  int groups = 1;       // scale groups per 32-element block: 2 for Q6_K, 1 otherwise
  BlockFormat format = BlockFormat::F32;
  CodeWidth width = CodeWidth::Byte;  // Format: the code's bits and zero point the format's
  std::vector<uint8_t> codes;     // 8 bits: [tiles, cols / 32, 8, 16, 4]; 4-6 bits: [.., 4, 16, 4]
  std::vector<uint64_t> planes;   // 5-6 bits: [tiles, cols / 32, bits - 4, 8] masks, bit 4 i + e
  std::vector<float> scales;      // [tiles, cols / 32, groups, 16], or empty for half_scales
  std::vector<float> offsets;     // the same, or empty (half_offsets, or c = -zero * d)
  std::vector<uint16_t> half_scales, half_offsets;  // the same in half precision
  // K formats in the format's width: scale d = super_scales * sub_scales, offset c =
  // super_mins * sub_mins (Q4_K: super_mins holds -dmin) or -zero * d (Q6_K).
  std::vector<int8_t> sub_scales, sub_mins;        // [tiles, cols / 32, groups, 16]
  std::vector<uint16_t> super_scales, super_mins;  // [tiles, cols / 256, 16], half precision

  bool empty() const { return rows == 0; }
  int64_t tiles() const { return (rows + kQ8TileRows - 1) / kQ8TileRows; }
  int64_t bytes() const {
    return static_cast<int64_t>(codes.size() + 8 * planes.size() + 4 * scales.size() +
                                4 * offsets.size() + 2 * half_scales.size() +
                                2 * half_offsets.size() + sub_scales.size() + sub_mins.size() +
                                2 * super_scales.size() + 2 * super_mins.size());
  }
};

// W's blocks repacked; every format but F32. Threads over tiles.
PackedQ8Matrix pack_q8(const BlockMatrix& w, CodeWidth width = CodeWidth::Byte);

// The value of element (row, col) as the packed matrix holds it: d * u + c (tests).
float packed_q8_value(const PackedQ8Matrix& w, int64_t row, int64_t col);

// y [x.n, w.rows] = x W^T. With AVX-512 VNNI the tiled kernel; without it, gemm_q8_reference.
// Both compute every sum in the same order: the same floats, bit for bit, in either width; and
// each x row's result is the same whatever the other rows are (a decode batch's row is the
// row alone).
void gemm_q8(const PackedQ8Matrix& w, const Q8Activations& x, float* y);

// The portable loops that define gemm_q8's result.
void gemm_q8_reference(const PackedQ8Matrix& w, const Q8Activations& x, float* y);

// True when this build has the VNNI kernel (compiled for a CPU with AVX-512 VNNI).
bool gemm_q8_uses_vnni();

}  // namespace kvbench
