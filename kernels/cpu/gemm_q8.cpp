#include "kernels/cpu/gemm_q8.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/block_layout.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/vnni.h"

namespace kvbench {
namespace {

using namespace block_layout;

constexpr int kGroupsOfFour = kBlock / 4;  // 4-code groups per block: one vpdpbusd each
constexpr int64_t kTileBlockCodes = kQ8TileRows * kBlock;

// x rows a microkernel call carries (each with its accumulator registers).
constexpr int kMaxRowsX = 8;
// Weight bytes requested ahead of the stream by the narrow kernel (decode: bound by memory).
constexpr int64_t kPrefetchBytes = 2048;
// x rows per panel: a panel's codes stay in the L2 cache while every tile of weights passes.
constexpr int64_t kPanelBytes = 256 * 1024;

// One 32-element block of a weight row as unsigned codes u with, per scale group, d and c:
// value = d * u + c.
struct Block32 {
  uint8_t u[kBlock];
  float d[2];
  float c[2];
  // K formats: d = half(super_d) * sub[g], c = half(super_min) * sub_min (Q4_K), exactly.
  int8_t sub[2] = {0, 0};
  int8_t sub_min = 0;
  uint16_t super_d = 0, super_min = 0;
};

Block32 unpack_block32(BlockFormat format, const uint8_t* row, int64_t b) {
  Block32 out{};
  const auto nibbles = [&](const uint8_t* qs) {
    for (int e = 0; e < 16; ++e) {
      out.u[e] = qs[e] & 0x0F;
      out.u[e + 16] = qs[e] >> 4;
    }
  };
  const auto fifth_bits = [&](const uint8_t* qh) {
    uint32_t bits;
    std::memcpy(&bits, qh, sizeof(bits));
    for (int e = 0; e < kBlock; ++e) out.u[e] |= static_cast<uint8_t>(((bits >> e) & 1) << 4);
  };
  switch (format) {
    case BlockFormat::Q8_0: {
      const uint8_t* blk = row + b * kQ8_0Bytes;
      out.d[0] = half_to_float(load_u16(blk));
      out.c[0] = -128.0f * out.d[0];
      for (int e = 0; e < kBlock; ++e) out.u[e] = static_cast<uint8_t>(blk[2 + e] ^ 0x80);
      break;
    }
    case BlockFormat::Q4_0: {
      const uint8_t* blk = row + b * kQ4_0Bytes;
      out.d[0] = half_to_float(load_u16(blk));
      out.c[0] = -8.0f * out.d[0];
      nibbles(blk + 2);
      break;
    }
    case BlockFormat::Q4_1: {
      const uint8_t* blk = row + b * kQ4_1Bytes;
      out.d[0] = half_to_float(load_u16(blk));
      out.c[0] = half_to_float(load_u16(blk + 2));
      nibbles(blk + 4);
      break;
    }
    case BlockFormat::Q5_0: {
      const uint8_t* blk = row + b * kQ5_0Bytes;
      out.d[0] = half_to_float(load_u16(blk));
      out.c[0] = -16.0f * out.d[0];
      nibbles(blk + 6);
      fifth_bits(blk + 2);
      break;
    }
    case BlockFormat::Q5_1: {
      const uint8_t* blk = row + b * kQ5_1Bytes;
      out.d[0] = half_to_float(load_u16(blk));
      out.c[0] = half_to_float(load_u16(blk + 2));
      nibbles(blk + 8);
      fifth_bits(blk + 4);
      break;
    }
    case BlockFormat::Q4_K: {
      const int64_t j = b % (kSuper / kBlock);
      const uint8_t* blk = row + b / (kSuper / kBlock) * kQ4_KBytes;
      int scale, min;
      q4_k_scale_min(static_cast<int>(j), blk + kQ4_KScales, &scale, &min);
      out.d[0] = half_to_float(load_u16(blk)) * static_cast<float>(scale);
      out.c[0] = -half_to_float(load_u16(blk + 2)) * static_cast<float>(min);
      out.sub[0] = static_cast<int8_t>(scale);
      out.sub_min = static_cast<int8_t>(min);
      out.super_d = load_u16(blk);
      out.super_min = static_cast<uint16_t>(load_u16(blk + 2) ^ 0x8000);  // -dmin
      const uint8_t* qs = blk + kQ4_KQs + 32 * (j / 2);
      for (int l = 0; l < kBlock; ++l) out.u[l] = j % 2 ? qs[l] >> 4 : qs[l] & 0x0F;
      break;
    }
    case BlockFormat::Q6_K: {
      const int64_t sub = b % (kSuper / kBlock);  // element 32 sub + l = 128 h + 32 g + l
      const uint8_t* blk = row + b / (kSuper / kBlock) * kQ6_KBytes;
      const int64_t h = sub / 4, g = sub % 4;
      const float d = half_to_float(load_u16(blk + kQ6_KD));
      const auto* scales = reinterpret_cast<const int8_t*>(blk + kQ6_KScales);
      for (int l = 0; l < kBlock; ++l) {
        const uint8_t ql = blk[64 * h + 32 * (g % 2) + l];
        const int low4 = g < 2 ? ql & 0x0F : ql >> 4;
        const int top2 = (blk[kQ6_KQh + 32 * h + l] >> (2 * g)) & 3;
        out.u[l] = static_cast<uint8_t>(low4 | (top2 << 4));
      }
      for (int k = 0; k < 2; ++k) {
        out.d[k] = d * static_cast<float>(scales[8 * h + 2 * g + k]);
        out.c[k] = -32.0f * out.d[k];
        out.sub[k] = scales[8 * h + 2 * g + k];
      }
      out.super_d = load_u16(blk + kQ6_KD);
      break;
    }
    case BlockFormat::F32:
      assert(false);
      break;
  }
  return out;
}

// Per x row and scale group: dx * (sum of the group's codes), the factor of the group's c.
std::vector<float> x_group_sums(const Q8Activations& x, int groups) {
  const int64_t blocks = x.n * (x.cols / kBlock);
  const int per_group = kBlock / groups;
  std::vector<float> out(static_cast<size_t>(blocks * groups));
#pragma omp parallel for schedule(static) if (blocks >= 4096)
  for (int64_t i = 0; i < blocks; ++i) {
    const int8_t* codes = x.codes.data() + i * kBlock;
    for (int g = 0; g < groups; ++g) {
      int32_t sum = x.sums[i];
      if (groups > 1) {
        sum = 0;
        for (int e = g * per_group; e < (g + 1) * per_group; ++e) sum += codes[e];
      }
      out[i * groups + g] = x.scales[i] * static_cast<float>(sum);
    }
  }
  return out;
}

// The format's own code width and what its scales can be kept as (CodeWidth::Format).
struct FormatTraits {
  int bits;
  float zero;    // c = -zero * d for every block (0: offsets of their own)
  bool half;     // scales (and offsets) are the format's half-precision values
  bool super;    // scales (and offsets) are small integers times a super-block's half
};

constexpr FormatTraits traits_of(BlockFormat f) {
  switch (f) {
    case BlockFormat::Q8_0: return {8, 128.0f, true, false};
    case BlockFormat::Q4_0: return {4, 8.0f, true, false};
    case BlockFormat::Q5_0: return {5, 16.0f, true, false};
    case BlockFormat::Q4_1: return {4, 0.0f, true, false};
    case BlockFormat::Q5_1: return {5, 0.0f, true, false};
    case BlockFormat::Q4_K: return {4, 0.0f, false, true};
    case BlockFormat::Q6_K: return {6, 32.0f, false, true};
    case BlockFormat::F32: break;
  }
  return {8, 0.0f, false, false};
}

// f as binary16, for f that came from one (every value is exact).
uint16_t exact_half(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const int exp = static_cast<int>((bits >> 23) & 0xFF);
  const uint32_t mant = bits & 0x7FFFFF;
  if (exp == 0xFF) return static_cast<uint16_t>(sign | 0x7C00 | (mant >> 13));
  if (exp == 0) return sign;
  if (exp >= 113) return static_cast<uint16_t>(sign | ((exp - 112) << 10) | (mant >> 13));
  return static_cast<uint16_t>(sign | ((0x800000 | mant) >> (126 - exp)));  // subnormal
}

constexpr int64_t kNibbleBytes = kTileBlockCodes / 2;  // 4 vectors of 64 bytes

// What the width leaves of the format's traits: Byte keeps every code in a byte, its offsets
// stored.
FormatTraits packed_traits(const PackedQ8Matrix& w) {
  return w.width == CodeWidth::Byte ? FormatTraits{8, 0.0f, false, false} : traits_of(w.format);
}

// Code e (0..31) of row i (0..15) of block b of a tile, in either width.
uint8_t code_at(const PackedQ8Matrix& w, int64_t tile_block, int64_t i, int e) {
  const int k = e / 4, bits = packed_traits(w).bits;
  if (bits == 8) return w.codes[tile_block * kTileBlockCodes + (k * kQ8TileRows + i) * 4 + e % 4];
  const uint8_t pair = w.codes[tile_block * kNibbleBytes + ((k % 4) * kQ8TileRows + i) * 4 + e % 4];
  int u = k < 4 ? pair & 0x0F : pair >> 4;
  for (int q = 0; q < bits - 4; ++q) {
    const uint64_t mask = w.planes[(tile_block * (bits - 4) + q) * kGroupsOfFour + k];
    u |= static_cast<int>((mask >> (4 * i + e % 4)) & 1) << (4 + q);
  }
  return static_cast<uint8_t>(u);
}

// Where the super-block scale of the scale at `at` is: 8 blocks a super-block, 16 rows a tile.
int64_t super_at(const PackedQ8Matrix& w, int64_t at) {
  return at / (kQ8TileRows * w.groups) / (kSuper / kBlock) * kQ8TileRows + at % kQ8TileRows;
}

float scale_at(const PackedQ8Matrix& w, int64_t at) {
  if (!w.sub_scales.empty()) {
    return half_to_float(w.super_scales[super_at(w, at)]) * static_cast<float>(w.sub_scales[at]);
  }
  return w.scales.empty() ? half_to_float(w.half_scales[at]) : w.scales[at];
}
float offset_at(const PackedQ8Matrix& w, int64_t at) {
  const float zero = packed_traits(w).zero;
  if (zero > 0) return -zero * scale_at(w, at);
  if (!w.sub_mins.empty()) {
    return half_to_float(w.super_mins[super_at(w, at)]) * static_cast<float>(w.sub_mins[at]);
  }
  return w.offsets.empty() ? half_to_float(w.half_offsets[at]) : w.offsets[at];
}

// The byte-wide packing narrowed to the format's own width (CodeWidth::Format).
PackedQ8Matrix narrow(PackedQ8Matrix p) {
  const FormatTraits t = traits_of(p.format);
  p.width = CodeWidth::Format;
  const int64_t tile_blocks = p.tiles() * (p.cols / kBlock);
  if (t.bits < 8) {
    std::vector<uint8_t> nibbles(static_cast<size_t>(tile_blocks * kNibbleBytes));
    std::vector<uint64_t> planes(static_cast<size_t>(tile_blocks * (t.bits - 4) * kGroupsOfFour));
#pragma omp parallel for schedule(static)
    for (int64_t tb = 0; tb < tile_blocks; ++tb) {
      const uint8_t* u = p.codes.data() + tb * kTileBlockCodes;
      for (int j = 0; j < 4; ++j) {
        for (int at = 0; at < kQ8TileRows * 4; ++at) {
          const uint8_t low = u[j * 64 + at], high = u[(j + 4) * 64 + at];
          nibbles[tb * kNibbleBytes + j * 64 + at] =
              static_cast<uint8_t>((low & 0x0F) | ((high & 0x0F) << 4));
        }
      }
      for (int q = 0; q < t.bits - 4; ++q) {
        for (int k = 0; k < kGroupsOfFour; ++k) {
          uint64_t mask = 0;
          for (int at = 0; at < kQ8TileRows * 4; ++at) {
            mask |= static_cast<uint64_t>((u[k * 64 + at] >> (4 + q)) & 1) << at;
          }
          planes[(tb * (t.bits - 4) + q) * kGroupsOfFour + k] = mask;
        }
      }
    }
    p.codes = std::move(nibbles);
    p.planes = std::move(planes);
  }
  if (t.half) {
    for (float d : p.scales) p.half_scales.push_back(exact_half(d));
    if (t.zero == 0) {
      for (float c : p.offsets) p.half_offsets.push_back(exact_half(c));
    }
    p.scales.clear();
  }
  if (t.super) p.scales.clear();
  if (t.half || t.super || t.zero > 0) p.offsets.clear();
  p.scales.shrink_to_fit();
  p.offsets.shrink_to_fit();
  return p;
}

#if KVBENCH_VNNI
// GCC 12's _mm512_cvtepi32_ps passes a self-initialized "undefined" vector that its own
// -Wmaybe-uninitialized then reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// out[m] = the 16 rows of one tile times x row m, for M x rows, over every block.
template <int M, int G>
void tile_kernel(const PackedQ8Matrix& w, int64_t tile, const int8_t* const* x_codes,
                 const float* const* x_scales, const float* const* x_sums, __m512 out[M]) {
  const int64_t nb = w.cols / kBlock;
  constexpr int kPerGroup = kGroupsOfFour / G;
  const auto* codes = reinterpret_cast<const __m512i*>(w.codes.data() + tile * nb * kTileBlockCodes);
  const float* scales = w.scales.data() + tile * nb * G * kQ8TileRows;
  const float* offsets = w.offsets.data() + tile * nb * G * kQ8TileRows;
  __m512 acc[M];
  KVBENCH_UNROLL
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    KVBENCH_UNROLL
    for (int g = 0; g < G; ++g) {
      __m512i sums[M];
      KVBENCH_UNROLL
      for (int m = 0; m < M; ++m) sums[m] = _mm512_setzero_si512();
      for (int k = g * kPerGroup; k < (g + 1) * kPerGroup; ++k) {
        const __m512i wk = _mm512_loadu_si512(codes + b * kGroupsOfFour + k);
        KVBENCH_UNROLL
        for (int m = 0; m < M; ++m) {
          sums[m] = dpbusd_broadcast(sums[m], wk, x_codes[m] + b * kBlock + 4 * k);
        }
      }
      const __m512 d = _mm512_loadu_ps(scales + (b * G + g) * kQ8TileRows);
      const __m512 c = _mm512_loadu_ps(offsets + (b * G + g) * kQ8TileRows);
      KVBENCH_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m512 d_dx = _mm512_mul_ps(d, _mm512_set1_ps(x_scales[m][b]));
        acc[m] = _mm512_fmadd_ps(d_dx, _mm512_cvtepi32_ps(sums[m]), acc[m]);
        acc[m] = _mm512_fmadd_ps(c, _mm512_set1_ps(x_sums[m][b * G + g]), acc[m]);
      }
    }
  }
  KVBENCH_UNROLL
  for (int m = 0; m < M; ++m) out[m] = acc[m];
}

inline __m256i halves(const uint16_t* sixteen) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sixteen));
}

// Sixteen int8 as floats.
inline __m512 small_ints(const int8_t* sixteen) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sixteen))));
}

// The same for CodeWidth::Format: each block's codes widened to bytes in registers (once per
// tile and block, for all M x rows), then the byte kernel's arithmetic in its order.
template <BlockFormat F, int M>
void narrow_tile_kernel(const PackedQ8Matrix& w, int64_t tile, const int8_t* const* x_codes,
                        const float* const* x_scales, const float* const* x_sums, __m512 out[M]) {
  constexpr FormatTraits kT = traits_of(F);
  constexpr int G = F == BlockFormat::Q6_K ? 2 : 1;
  constexpr int kPlanes = kT.bits < 8 ? kT.bits - 4 : 0;
  const int64_t nb = w.cols / kBlock;
  const int64_t first = tile * nb;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[M];
  KVBENCH_UNROLL
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i sums[G][M];
    KVBENCH_UNROLL
    for (int g = 0; g < G; ++g) {
      KVBENCH_UNROLL
      for (int m = 0; m < M; ++m) sums[g][m] = _mm512_setzero_si512();
    }
    if constexpr (kT.bits == 8) {
      const auto* codes =
          reinterpret_cast<const __m512i*>(w.codes.data() + (first + b) * kTileBlockCodes);
      for (int k = 0; k < kGroupsOfFour; ++k) {
        _mm_prefetch(reinterpret_cast<const char*>(codes + k) + kPrefetchBytes, _MM_HINT_T0);
        const __m512i wk = _mm512_loadu_si512(codes + k);
        KVBENCH_UNROLL
        for (int m = 0; m < M; ++m) {
          sums[0][m] = dpbusd_broadcast(sums[0][m], wk, x_codes[m] + b * kBlock + 4 * k);
        }
      }
    } else {
      const uint8_t* nibbles = w.codes.data() + (first + b) * kNibbleBytes;
      const uint64_t* planes = w.planes.data() + (first + b) * kPlanes * kGroupsOfFour;
      for (int j = 0; j < 4; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(nibbles + 64 * j) + kPrefetchBytes, _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(nibbles + 64 * j);
        __m512i lo = _mm512_and_si512(v, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        for (int q = 0; q < kPlanes; ++q) {
          const __m512i bit = _mm512_set1_epi8(static_cast<char>(16 << q));
          lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64(planes[q * kGroupsOfFour + j]), lo, bit);
          hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64(planes[q * kGroupsOfFour + j + 4]), hi, bit);
        }
        KVBENCH_UNROLL
        for (int m = 0; m < M; ++m) {
          const int8_t* xb = x_codes[m] + b * kBlock;
          sums[0][m] = dpbusd_broadcast(sums[0][m], lo, xb + 4 * j);
          sums[G - 1][m] = dpbusd_broadcast(sums[G - 1][m], hi, xb + 4 * (j + 4));
        }
      }
    }
    KVBENCH_UNROLL
    for (int g = 0; g < G; ++g) {
      const int64_t at = ((first + b) * G + g) * kQ8TileRows;
      const int64_t super = (first + b) / (kSuper / kBlock) * kQ8TileRows;
      __m512 d, c;
      if constexpr (kT.super) {
        d = _mm512_mul_ps(_mm512_cvtph_ps(halves(w.super_scales.data() + super)),
                          small_ints(w.sub_scales.data() + at));
      } else if constexpr (kT.half) {
        d = _mm512_cvtph_ps(halves(w.half_scales.data() + at));
      } else {
        d = _mm512_loadu_ps(w.scales.data() + at);
      }
      if constexpr (kT.zero > 0) {
        c = _mm512_mul_ps(_mm512_set1_ps(-kT.zero), d);
      } else if constexpr (kT.super) {
        c = _mm512_mul_ps(_mm512_cvtph_ps(halves(w.super_mins.data() + super)),
                          small_ints(w.sub_mins.data() + at));
      } else if constexpr (kT.half) {
        c = _mm512_cvtph_ps(halves(w.half_offsets.data() + at));
      } else {
        c = _mm512_loadu_ps(w.offsets.data() + at);
      }
      KVBENCH_UNROLL
      for (int m = 0; m < M; ++m) {
        const __m512 d_dx = _mm512_mul_ps(d, _mm512_set1_ps(x_scales[m][b]));
        acc[m] = _mm512_fmadd_ps(d_dx, _mm512_cvtepi32_ps(sums[g][m]), acc[m]);
        acc[m] = _mm512_fmadd_ps(c, _mm512_set1_ps(x_sums[m][b * G + g]), acc[m]);
      }
    }
  }
  KVBENCH_UNROLL
  for (int m = 0; m < M; ++m) out[m] = acc[m];
}
#pragma GCC diagnostic pop

using TileKernel = void (*)(const PackedQ8Matrix&, int64_t, const int8_t* const*,
                            const float* const*, const float* const*, __m512*);
template <int G>
constexpr TileKernel kTileKernels[kMaxRowsX] = {
    tile_kernel<1, G>, tile_kernel<2, G>, tile_kernel<3, G>, tile_kernel<4, G>,
    tile_kernel<5, G>, tile_kernel<6, G>, tile_kernel<7, G>, tile_kernel<8, G>};

template <BlockFormat F>
constexpr TileKernel kNarrowKernels[kMaxRowsX] = {
    narrow_tile_kernel<F, 1>, narrow_tile_kernel<F, 2>, narrow_tile_kernel<F, 3>,
    narrow_tile_kernel<F, 4>, narrow_tile_kernel<F, 5>, narrow_tile_kernel<F, 6>,
    narrow_tile_kernel<F, 7>, narrow_tile_kernel<F, 8>};

const TileKernel* tile_kernels(const PackedQ8Matrix& w) {
  if (w.width == CodeWidth::Byte) return w.groups == 2 ? kTileKernels<2> : kTileKernels<1>;
  switch (w.format) {
    case BlockFormat::Q8_0: return kNarrowKernels<BlockFormat::Q8_0>;
    case BlockFormat::Q4_0: return kNarrowKernels<BlockFormat::Q4_0>;
    case BlockFormat::Q5_0: return kNarrowKernels<BlockFormat::Q5_0>;
    case BlockFormat::Q4_1: return kNarrowKernels<BlockFormat::Q4_1>;
    case BlockFormat::Q5_1: return kNarrowKernels<BlockFormat::Q5_1>;
    case BlockFormat::Q4_K: return kNarrowKernels<BlockFormat::Q4_K>;
    case BlockFormat::Q6_K: return kNarrowKernels<BlockFormat::Q6_K>;
    case BlockFormat::F32: break;
  }
  assert(false);
  return nullptr;
}

void gemm_q8_vnni(const PackedQ8Matrix& w, const Q8Activations& x, float* y) {
  const int64_t nb = w.cols / kBlock;
  const int G = w.groups;
  const std::vector<float> group_sums = x_group_sums(x, G);
  const TileKernel* kernels = tile_kernels(w);
  const int64_t tiles = w.tiles();
  const int64_t panel = std::max<int64_t>(kMaxRowsX, kPanelBytes / w.cols / kMaxRowsX * kMaxRowsX);
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), tiles));
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t first = tiles * t / nt, last = tiles * (t + 1) / nt;
    for (int64_t p0 = 0; p0 < x.n; p0 += panel) {
      const int64_t p1 = std::min(x.n, p0 + panel);
      for (int64_t tile = first; tile < last; ++tile) {
        const int64_t r0 = tile * kQ8TileRows;
        const int64_t valid = std::min<int64_t>(kQ8TileRows, w.rows - r0);
        const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
        for (int64_t i0 = p0; i0 < p1; i0 += kMaxRowsX) {
          const int m_rows = static_cast<int>(std::min<int64_t>(kMaxRowsX, p1 - i0));
          const int8_t* codes[kMaxRowsX];
          const float* scales[kMaxRowsX];
          const float* sums[kMaxRowsX];
          for (int m = 0; m < m_rows; ++m) {
            codes[m] = x.codes.data() + (i0 + m) * w.cols;
            scales[m] = x.scales.data() + (i0 + m) * nb;
            sums[m] = group_sums.data() + (i0 + m) * nb * G;
          }
          __m512 out[kMaxRowsX];
          kernels[m_rows - 1](w, tile, codes, scales, sums, out);
          for (int m = 0; m < m_rows; ++m) {
            _mm512_mask_storeu_ps(y + (i0 + m) * w.rows + r0, mask, out[m]);
          }
        }
      }
    }
  }
}
#endif

}  // namespace

PackedQ8Matrix pack_q8(const BlockMatrix& w, CodeWidth width) {
  assert(w.format != BlockFormat::F32 && w.cols % kBlock == 0);
  PackedQ8Matrix p;
  p.rows = w.rows;
  p.cols = w.cols;
  p.format = w.format;
  p.groups = w.format == BlockFormat::Q6_K ? 2 : 1;
  const int64_t nb = w.cols / kBlock, tiles = p.tiles();
  p.codes.assign(static_cast<size_t>(tiles * nb * kTileBlockCodes), 0);
  p.scales.assign(static_cast<size_t>(tiles * nb * p.groups * kQ8TileRows), 0.0f);
  p.offsets.assign(p.scales.size(), 0.0f);
  const bool super = width == CodeWidth::Format && traits_of(w.format).super;
  if (super) {
    assert(w.cols % kSuper == 0);
    p.sub_scales.assign(p.scales.size(), 0);
    p.sub_mins.assign(w.format == BlockFormat::Q4_K ? p.scales.size() : 0, 0);
    p.super_scales.assign(static_cast<size_t>(tiles * (w.cols / kSuper) * kQ8TileRows), 0);
    p.super_mins.assign(p.sub_mins.empty() ? 0 : p.super_scales.size(), 0);
  }
  const auto* base = static_cast<const uint8_t*>(w.data);
#pragma omp parallel for schedule(static)
  for (int64_t tile = 0; tile < tiles; ++tile) {
    for (int64_t i = 0; i < kQ8TileRows && tile * kQ8TileRows + i < w.rows; ++i) {
      const uint8_t* row = base + (tile * kQ8TileRows + i) * w.row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const Block32 blk = unpack_block32(w.format, row, b);
        uint8_t* codes = p.codes.data() + (tile * nb + b) * kTileBlockCodes;
        for (int k = 0; k < kGroupsOfFour; ++k) {
          std::memcpy(codes + (k * kQ8TileRows + i) * 4, blk.u + 4 * k, 4);
        }
        for (int g = 0; g < p.groups; ++g) {
          const int64_t at = ((tile * nb + b) * p.groups + g) * kQ8TileRows + i;
          p.scales[at] = blk.d[g];
          p.offsets[at] = blk.c[g];
          if (super) p.sub_scales[at] = blk.sub[g];
        }
        if (super) {
          const int64_t at = (tile * nb + b) * p.groups * kQ8TileRows + i;
          const int64_t sat = super_at(p, at);
          p.super_scales[sat] = blk.super_d;
          if (!p.sub_mins.empty()) {
            p.sub_mins[at] = blk.sub_min;
            p.super_mins[sat] = blk.super_min;
          }
        }
      }
    }
  }
  return width == CodeWidth::Byte ? p : narrow(std::move(p));
}

float packed_q8_value(const PackedQ8Matrix& w, int64_t row, int64_t col) {
  const int64_t nb = w.cols / kBlock, tile = row / kQ8TileRows, i = row % kQ8TileRows;
  const int64_t b = col / kBlock, e = col % kBlock;
  const uint8_t u = code_at(w, tile * nb + b, i, static_cast<int>(e));
  const int64_t at = ((tile * nb + b) * w.groups + e / (kBlock / w.groups)) * kQ8TileRows + i;
  return scale_at(w, at) * static_cast<float>(u) + offset_at(w, at);
}

void gemm_q8_reference(const PackedQ8Matrix& w, const Q8Activations& x, float* y) {
  const int64_t nb = w.cols / kBlock;
  const int G = w.groups, per_group = kBlock / G;
  const std::vector<float> group_sums = x_group_sums(x, G);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < w.rows; ++r) {
    const int64_t tile = r / kQ8TileRows, i = r % kQ8TileRows;
    for (int64_t n = 0; n < x.n; ++n) {
      const int8_t* xc = x.codes.data() + n * w.cols;
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        KVBENCH_UNROLL
        for (int g = 0; g < G; ++g) {
          int32_t sum = 0;
          for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
            sum += static_cast<int32_t>(code_at(w, tile * nb + b, i, e)) * xc[b * kBlock + e];
          }
          const int64_t at = ((tile * nb + b) * G + g) * kQ8TileRows + i;
          const float d_dx = scale_at(w, at) * x.scales[n * nb + b];
          acc = std::fma(d_dx, static_cast<float>(sum), acc);
          acc = std::fma(offset_at(w, at), group_sums[(n * nb + b) * G + g], acc);
        }
      }
      y[n * w.rows + r] = acc;
    }
  }
}

void gemm_q8(const PackedQ8Matrix& w, const Q8Activations& x, float* y) {
  assert(x.cols == w.cols);
#if KVBENCH_VNNI
  gemm_q8_vnni(w, x, y);
#else
  gemm_q8_reference(w, x, y);
#endif
}

bool gemm_q8_uses_vnni() {
#if KVBENCH_VNNI
  return true;
#else
  return false;
#endif
}

}  // namespace kvbench
