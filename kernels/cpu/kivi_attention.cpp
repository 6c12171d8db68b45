#include "kernels/cpu/kivi_attention.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/block_matvec_q8.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/tile_gemm.h"
#include "kernels/cpu/vnni.h"

// How the kernel reads a block of 32 slots of one KV head (no fp32 copy of the cache exists):
//  - the codes of a group (a key channel over 32 tokens, or 32 channels of a value token) are
//    zero-extended a byte per lane and masked, so lane i of vector j holds element(j, i) of the
//    group times 4^j (2 bits) or 16^(j % 2) (4 bits); sums are rescaled once per block instead
//    of every code being shifted;
//  - keys: s_t = sum_d (q_d scale_d) c_dt + sum_d q_d min_d, then put in token order;
//    values: o_d += sum_t (p_t scale_t) c_td + sum_t p_t min_t, the output kept in the unpacked
//    channel order while a work item reads blocks and put back before the fp32 tail;
//  - few query rows (decode: one GQA group; up to 3 with AVX2, 8 with AVX-512) read the codes
//    straight into registers (4 bits on int8 activations: with integer dot products, below);
//    more rows (prefill chunks) unpack the block once into fp32 tiles in L1 shared by all
//    rows (GEMM).
// Softmax is online (FlashAttention) over blocks, then tail tiles; split-K partials are merged
// as in attention_dense_cpu.

namespace kvbench {
namespace {

using namespace tile;

constexpr int kGroup = 32;           // KIVI's group: tokens per block, channels per value group
constexpr int kTileRows = 192;       // target query rows (query x head) per work item
constexpr int kMinSplitSlots = 512;  // split-K never makes a split shorter than this
// Up to this many rows read codes straight into registers: AVX-512's 32 registers hold 8 rows'
// accumulators (a GQA group of 7, Qwen2.5's, among them), AVX2's 16 hold 3.
#if defined(__AVX512F__) && KVBENCH_AVX2
#define KVBENCH_KIVI_ZMM 1
constexpr int kCodeRows = 8;
#else
constexpr int kCodeRows = 3;
#endif
// Rows on int8 activations read 4-bit codes with vpdpbusd (VNNI), laid out by vpermt2b (VBMI).
#if KVBENCH_KIVI_ZMM && KVBENCH_VNNI && defined(__AVX512VBMI__)
#define KVBENCH_KIVI_INT8 1
#endif
constexpr uint32_t kAllSlots = 0xFFFFFFFFu;
constexpr int kMaxItemHeads = 64;  // KV heads a work item may hold

// Element (token of a key group, channel of a value group) that unpacked lane i of vector j
// holds, for j, i in [0, 4) x [0, 8): a byte per lane, 8 / bits codes per byte.
constexpr int element(int bits, int j, int i) {
  return bits == 2 ? 4 * i + j : 16 * (j / 2) + 2 * i + (j % 2);
}

inline int code_at(const uint8_t* codes, int bits, int e) {
  return (codes[e * bits / 8] >> ((e * bits) % 8)) & ((1 << bits) - 1);
}

// A run of slots one work item reads: a block (start = 32 b, len 32, sel = which of its slots
// the page selection keeps, bit t = slot 32 b + t) or up to kKeyTile slots of the fp32 tail
// (start >= the blocks' slots).
struct Segment {
  int64_t start;
  int32_t len;
  uint32_t sel;
};

// One block of one KV head: pointers into KiviKv's block-major arrays.
struct BlockView {
  const uint8_t* k_codes;    // [head_dim, 4 * bits]
  const float* k_scale;      // [head_dim]
  const float* k_min;        // [head_dim]
  const uint8_t* v_codes;    // [32, head_dim * bits / 8]
  const float* v_scale;      // [32, head_dim / 32]
  const float* v_min;        // [32, head_dim / 32]
  const int32_t* positions;  // [32]
};

BlockView block_view(const KiviKv& kv, int64_t b, int kvh) {
  const int dim = kv.tail.head_dim;
  const int64_t blk = b * kv.tail.n_kv_heads + kvh;
  const int64_t code_bytes = static_cast<int64_t>(kGroup) * dim * kv.bits / 8;
  const int64_t value_groups = kGroup * (dim / kGroup);
  return BlockView{
      kv.k_codes + blk * code_bytes, kv.k_scale + blk * dim,          kv.k_min + blk * dim,
      kv.v_codes + blk * code_bytes, kv.v_scale + blk * value_groups, kv.v_min + blk * value_groups,
      kv.positions + blk * kGroup};
}

// Per-thread buffers, reused across calls so decode does not allocate per layer. A work item
// holds the query rows of one or more KV heads (q, o, m, l, qpos: [item rows]); the rest is
// per head and block.
struct Scratch {
  std::vector<float> q;       // [rows, head_dim] queries pre-scaled by scale * log2(e)
  std::vector<float> o;       // [rows, head_dim] unnormalised output
  std::vector<float> s;       // [head rows, kKeyTile] scores, then probabilities
  std::vector<float> kt;      // [head_dim, kKeyTile] key tile, transposed
  std::vector<float> vt;      // [32, head_dim] value tile (permuted channels)
  std::vector<float> qs;      // [kCodeRows, head_dim] q * the block's key scales
  std::vector<float> vw;      // [kCodeRows, head_dim] p * the block's value scales
  std::vector<int8_t> q8;     // [kCodeRows, head_dim] those two rounded to 8 bits (int8 rows)
  std::vector<float> m, l;    // [rows] running max (log2 domain) and softmax denominator
  std::vector<int32_t> qpos;  // [rows]
};

void ensure(Scratch& w, int rows, int head_rows, int dim) {
  auto grow = [](auto& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  grow(w.q, static_cast<size_t>(rows) * dim);
  grow(w.o, static_cast<size_t>(rows) * dim);
  grow(w.s, static_cast<size_t>(head_rows) * kKeyTile);
  grow(w.kt, static_cast<size_t>(dim) * kKeyTile);
  grow(w.vt, static_cast<size_t>(kGroup) * dim);
  grow(w.qs, static_cast<size_t>(kCodeRows) * dim);
  grow(w.vw, static_cast<size_t>(kCodeRows) * dim);
  grow(w.q8, static_cast<size_t>(kCodeRows) * dim);
  grow(w.m, rows);
  grow(w.l, rows);
  grow(w.qpos, rows);
}

// ---- Unpacking codes (AVX2) -------------------------------------------------------------------

template <int BITS>
inline float unit_of(int j) {
  if constexpr (BITS == 2) return 1.0f / static_cast<float>(1 << (2 * j));
  return j % 2 == 0 ? 1.0f : 1.0f / 16.0f;
}

#if KVBENCH_AVX2
// The same pointer, which the compiler can no longer prove equal to p: loads through it are not
// merged with earlier ones (a merged broadcast would stay live and push an accumulator out).
template <class T>
inline const T* opaque(const T* p) {
  asm volatile("" : "+r"(p));
  return p;
}

inline __m256i load_bytes(const uint8_t* codes) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
}

// Vector j of a group's 32 codes (lane i = element(j, i)) from its bytes [0, 8) in x0 and
// [8, 16) in x1 (4 bits), times 4^j (2 bits) or 16^(j % 2) (4 bits).
template <int BITS>
inline __m256 codes_times_unit(__m256i x0, __m256i x1, int j) {
  if constexpr (BITS == 2) {
    (void)x1;
    return _mm256_cvtepi32_ps(_mm256_and_si256(x0, _mm256_set1_epi32(3 << (2 * j))));
  } else {
    return _mm256_cvtepi32_ps(
        _mm256_and_si256(j < 2 ? x0 : x1, _mm256_set1_epi32(j % 2 == 0 ? 15 : 240)));
  }
}

// Four vectors of a group in element() order -> the group's 32 values in order.
template <int BITS>
inline void store_in_order(const __m256 v[4], float* out) {
  if constexpr (BITS == 2) {  // lane i of vector j is element 4 i + j: a 4 x 8 transpose
    const __m256 a = _mm256_unpacklo_ps(v[0], v[1]), b = _mm256_unpacklo_ps(v[2], v[3]);
    const __m256 c = _mm256_unpackhi_ps(v[0], v[1]), d = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 e0 = _mm256_shuffle_ps(a, b, 0x44), e1 = _mm256_shuffle_ps(a, b, 0xEE);
    const __m256 e2 = _mm256_shuffle_ps(c, d, 0x44), e3 = _mm256_shuffle_ps(c, d, 0xEE);
    _mm256_storeu_ps(out, _mm256_permute2f128_ps(e0, e1, 0x20));
    _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(e2, e3, 0x20));
    _mm256_storeu_ps(out + 16, _mm256_permute2f128_ps(e0, e1, 0x31));
    _mm256_storeu_ps(out + 24, _mm256_permute2f128_ps(e2, e3, 0x31));
  } else {  // lane i of vector j is element 16 (j / 2) + 2 i + j % 2: interleave pairs
    for (int u = 0; u < 2; ++u) {
      const __m256 lo = _mm256_unpacklo_ps(v[2 * u], v[2 * u + 1]);
      const __m256 hi = _mm256_unpackhi_ps(v[2 * u], v[2 * u + 1]);
      _mm256_storeu_ps(out + 16 * u, _mm256_permute2f128_ps(lo, hi, 0x20));
      _mm256_storeu_ps(out + 16 * u + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
  }
}
#endif

// ---- Unpacking a block into fp32 tiles (any number of rows) ----------------------------------

// kt[d][t] = min_d + scale_d * c_dt, tokens in order.
template <int BITS>
void unpack_key_tile(const BlockView& b, int dim, float* kt) {
  constexpr int kGroupBytes = 4 * BITS;
  for (int d = 0; d < dim; ++d) {
    const uint8_t* codes = b.k_codes + d * kGroupBytes;
#if KVBENCH_AVX2
    const __m256i x0 = load_bytes(codes);
    const __m256i x1 = BITS == 4 ? load_bytes(codes + 8) : x0;
    const __m256 lo = _mm256_set1_ps(b.k_min[d]);
    __m256 v[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 scale = _mm256_set1_ps(b.k_scale[d] * unit_of<BITS>(j));
      v[j] = _mm256_fmadd_ps(codes_times_unit<BITS>(x0, x1, j), scale, lo);
    }
    store_in_order<BITS>(v, kt + d * kGroup);
#else
    for (int t = 0; t < kGroup; ++t) {
      kt[d * kGroup + t] = b.k_min[d] + static_cast<float>(code_at(codes, BITS, t)) * b.k_scale[d];
    }
#endif
  }
}

// vt[t][32 h + 8 j + i] = min_th + scale_th * c_t,(32 h + element(j, i)).
template <int BITS>
void unpack_value_tile(const BlockView& b, int dim, float* vt) {
  constexpr int kGroupBytes = 4 * BITS;
  const int n_groups = dim / kGroup;
  for (int t = 0; t < kGroup; ++t) {
    for (int h = 0; h < n_groups; ++h) {
      const uint8_t* codes = b.v_codes + (t * n_groups + h) * kGroupBytes;
      const float scale = b.v_scale[t * n_groups + h], lo = b.v_min[t * n_groups + h];
      float* dst = vt + t * dim + h * kGroup;
#if KVBENCH_AVX2
      const __m256i x0 = load_bytes(codes);
      const __m256i x1 = BITS == 4 ? load_bytes(codes + 8) : x0;
      for (int j = 0; j < 4; ++j) {
        const __m256 c = codes_times_unit<BITS>(x0, x1, j);
        _mm256_storeu_ps(dst + 8 * j, _mm256_fmadd_ps(c, _mm256_set1_ps(scale * unit_of<BITS>(j)),
                                                      _mm256_set1_ps(lo)));
      }
#else
      for (int j = 0; j < 4; ++j) {
        for (int i = 0; i < 8; ++i) {
          const int code = code_at(codes, BITS, element(BITS, j, i));
          dst[8 * j + i] = lo + static_cast<float>(code) * scale;
        }
      }
#endif
    }
  }
}

// ---- Reading codes straight into registers (few rows, AVX2) ----------------------------------
//
// Both loops are bound by their 4 R FMAs per 32 codes if little else competes for the FP pipes:
// each FMA broadcasts its row's multiplier from L1 rather than holding R more vectors beside the
// 4 R accumulators (16 registers).

#if KVBENCH_AVX2
// s[r][t] = q_r . k_t for the block's 32 tokens, in order (q rows dim apart, s rows kGroup
// apart): sum_d (q_r,d scale_d) c_dt + sum_d q_r,d min_d. qs: [R, dim] scratch.
// qs[r][d] = q_r,d scale_d and bias[r] = sum_d q_r,d min_d: what the codes are multiplied by,
// and the minimums' share of every score.
template <int R>
void scaled_queries(const float* __restrict q, int dim, const BlockView& b, float* __restrict qs,
                    float bias[R]) {
  KVBENCH_UNROLL
  for (int r = 0; r < R; ++r) {
    __m256 acc = _mm256_setzero_ps();
    for (int d = 0; d < dim; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + r * dim + d);
      _mm256_storeu_ps(qs + r * dim + d, _mm256_mul_ps(qv, _mm256_loadu_ps(b.k_scale + d)));
      acc = _mm256_fmadd_ps(qv, _mm256_loadu_ps(b.k_min + d), acc);
    }
    bias[r] = hsum(acc);
  }
}

template <int R, int BITS>
void key_scores_from_codes(const float* __restrict q, int dim, const BlockView& b,
                           float* __restrict qs, float* __restrict s) {
  constexpr int kGroupBytes = 4 * BITS;
  float bias[R];
  scaled_queries<R>(q, dim, b, qs, bias);
  __m256 acc[R][4];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int d = 0; d < dim; ++d) {
    const uint8_t* codes = b.k_codes + d * kGroupBytes;
    const __m256i x0 = load_bytes(codes);
    const __m256i x1 = BITS == 4 ? load_bytes(codes + 8) : x0;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256 c = codes_times_unit<BITS>(x0, x1, j);
      const float* qd = opaque(qs + d);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(qd + r * dim), c, acc[r][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256 bv = _mm256_set1_ps(bias[r]);
    __m256 v[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_fmadd_ps(acc[r][j], _mm256_set1_ps(unit_of<BITS>(j)), bv);
    }
    store_in_order<BITS>(v, s + r * kGroup);
  }
}

// Lane l of vector n of a block's [32, G] value scales is token (8 n + l) / G: where that
// token's probability sits in its 8-token vector, for G = 1, 2, 4, 8 and n % G.
struct ExpandTable {
  int32_t idx[4][8][8];  // [log2 G][n % G][lane]
};
constexpr ExpandTable make_expand_table() {
  ExpandTable t{};
  for (int g = 0; g < 4; ++g) {
    for (int b = 0; b < 8; ++b) {
      for (int l = 0; l < 8; ++l) t.idx[g][b][l] = ((8 * b + l) >> g) % 8;
    }
  }
  return t;
}
constexpr ExpandTable kExpand = make_expand_table();

// o[r][32 h + 8 j + i] += sum_t p[r][t] v_t,(32 h + element(j, i)), p rows kGroup apart.
// Needs G = head_dim / 32 in {1, 2, 4, 8}. w: [R, 32 G] scratch for the weights
// p[r][t] * scale_th, laid out as v_scale.
//
// weighted_probs: w[r] = p[r][t] * scale_th (laid out as v_scale) and bias[r][h] =
// sum_t p[r][t] min_th, the minimums' share, added to every channel of group h.
template <int R>
void weighted_probs(const float* __restrict p, int dim, const BlockView& b, float* __restrict w,
                    float bias[R][8]) {
  const int n_groups = dim / kGroup;
  const int log2_groups = n_groups == 1 ? 0 : n_groups == 2 ? 1 : n_groups == 4 ? 2 : 3;
  KVBENCH_UNROLL
  for (int r = 0; r < R; ++r) {
    __m256 acc = _mm256_setzero_ps();
    for (int n = 0; n < 4 * n_groups; ++n) {
      const __m256i idx = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(kExpand.idx[log2_groups][n & (n_groups - 1)]));
      const __m256 pe =
          _mm256_permutevar8x32_ps(_mm256_loadu_ps(p + r * kGroup + 8 * (n >> log2_groups)), idx);
      _mm256_storeu_ps(w + r * dim + 8 * n, _mm256_mul_ps(pe, _mm256_loadu_ps(b.v_scale + 8 * n)));
      acc = _mm256_fmadd_ps(pe, _mm256_loadu_ps(b.v_min + 8 * n), acc);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    for (int h = 0; h < n_groups; ++h) {
      bias[r][h] = 0.0f;
      for (int l = h; l < 8; l += n_groups) bias[r][h] += lanes[l];
    }
  }
}

template <int R, int BITS>
void values_from_codes(const float* __restrict p, int dim, const BlockView& b, float* __restrict w,
                       float* __restrict o) {
  constexpr int kGroupBytes = 4 * BITS;
  const int n_groups = dim / kGroup;
  const int row_bytes = n_groups * kGroupBytes;
  float bias[R][8];
  weighted_probs<R>(p, dim, b, w, bias);
  for (int h = 0; h < n_groups; ++h) {
    __m256 acc[R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
    }
    for (int t = 0; t < kGroup; ++t) {
      const uint8_t* codes = b.v_codes + t * row_bytes + h * kGroupBytes;
      const __m256i x0 = load_bytes(codes);
      const __m256i x1 = BITS == 4 ? load_bytes(codes + 8) : x0;
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m256 c = codes_times_unit<BITS>(x0, x1, j);
        const float* wt = opaque(w + t * n_groups + h);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          acc[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(wt + r * dim), c, acc[r][j]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 bv = _mm256_set1_ps(bias[r][h]);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        float* dst = o + r * dim + h * kGroup + 8 * j;
        const __m256 add = _mm256_fmadd_ps(acc[r][j], _mm256_set1_ps(unit_of<BITS>(j)), bv);
        _mm256_storeu_ps(dst, _mm256_add_ps(_mm256_loadu_ps(dst), add));
      }
    }
  }
}

#if KVBENCH_KIVI_ZMM
// GCC 12's _mm512_cvtepu8_epi32 and _mm512_cvtepi32_ps pass a self-initialized "undefined"
// vector that its own -Wmaybe-uninitialized then reports.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The same two loops on 16-lane vectors: vector J of a group's codes is the AVX2 loops' vectors
// 2J and 2J + 1 side by side (lane l holds element(2J + l / 8, l % 8)), and every lane runs the
// AVX2 lane's float operations in its order, so the outputs equal the AVX2 kernels' bit for bit
// (with 8 rows' 16 accumulators in 32 registers where AVX2 fits 3 rows' 12 in 16).

// Bytes [0, 8) of a group (4 bits: [8 J, 8 J + 8)) in both halves, a byte per lane.
inline __m512i load_bytes_twice(const uint8_t* codes) {
  const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
  return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(x, x));
}

// Per-lane mask and unit of vector J: AVX2 vector 2J's in lanes [0, 8), 2J + 1's in [8, 16).
template <int BITS>
inline __m512i lane_masks(int J) {
  const auto mask = [](int j) { return BITS == 2 ? 3 << (2 * j) : j % 2 == 0 ? 15 : 240; };
  return _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(mask(2 * J)),
                                 _mm512_set1_epi32(mask(2 * J + 1)));
}
template <int BITS>
inline __m512 lane_units(int J) {
  return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(unit_of<BITS>(2 * J)),
                              _mm512_set1_ps(unit_of<BITS>(2 * J + 1)));
}

// Index tables for _mm512_permutex2var_ps: output vector O's lane m is token 16 O + m, found in
// vector J = j / 2, lane 8 (j % 2) + i where element(j, i) = 16 O + m (bit 4 picks J = 1).
struct OrderTable {
  int32_t idx[2][2][16];  // [bits == 4][O][m]
};
constexpr OrderTable make_order_table() {
  OrderTable t{};
  for (int b4 = 0; b4 < 2; ++b4) {
    for (int j = 0; j < 4; ++j) {
      for (int i = 0; i < 8; ++i) {
        const int e = b4 ? 16 * (j / 2) + 2 * i + (j % 2) : 4 * i + j;
        t.idx[b4][e / 16][e % 16] = 16 * (j / 2) + 8 * (j % 2) + i;
      }
    }
  }
  return t;
}
constexpr OrderTable kOrder = make_order_table();

template <int R, int BITS>
void key_scores_from_codes_zmm(const float* __restrict q, int dim, const BlockView& b,
                               float* __restrict qs, float* __restrict s) {
  constexpr int kGroupBytes = 4 * BITS;
  float bias[R];
  scaled_queries<R>(q, dim, b, qs, bias);
  const __m512i mask[2] = {lane_masks<BITS>(0), lane_masks<BITS>(1)};
  __m512 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int d = 0; d < dim; ++d) {
    const uint8_t* codes = b.k_codes + d * kGroupBytes;
    const __m512i x0 = load_bytes_twice(codes);
    const __m512i x1 = BITS == 4 ? load_bytes_twice(codes + 8) : x0;
#pragma GCC unroll 2
    for (int J = 0; J < 2; ++J) {
      const __m512 c = _mm512_cvtepi32_ps(_mm512_and_si512(J == 0 ? x0 : x1, mask[J]));
      const float* qd = opaque(qs + d);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        acc[r][J] = _mm512_fmadd_ps(_mm512_set1_ps(qd[r * dim]), c, acc[r][J]);
      }
    }
  }
  const __m512 unit[2] = {lane_units<BITS>(0), lane_units<BITS>(1)};
  const __m512i order0 = _mm512_loadu_si512(kOrder.idx[BITS == 4][0]);
  const __m512i order1 = _mm512_loadu_si512(kOrder.idx[BITS == 4][1]);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 bv = _mm512_set1_ps(bias[r]);
    const __m512 v0 = _mm512_fmadd_ps(acc[r][0], unit[0], bv);
    const __m512 v1 = _mm512_fmadd_ps(acc[r][1], unit[1], bv);
    _mm512_storeu_ps(s + r * kGroup, _mm512_permutex2var_ps(v0, order0, v1));
    _mm512_storeu_ps(s + r * kGroup + 16, _mm512_permutex2var_ps(v0, order1, v1));
  }
}

template <int R, int BITS>
void values_from_codes_zmm(const float* __restrict p, int dim, const BlockView& b,
                           float* __restrict w, float* __restrict o) {
  constexpr int kGroupBytes = 4 * BITS;
  const int n_groups = dim / kGroup;
  const int row_bytes = n_groups * kGroupBytes;
  float bias[R][8];
  weighted_probs<R>(p, dim, b, w, bias);
  const __m512i mask[2] = {lane_masks<BITS>(0), lane_masks<BITS>(1)};
  const __m512 unit[2] = {lane_units<BITS>(0), lane_units<BITS>(1)};
  for (int h = 0; h < n_groups; ++h) {
    __m512 acc[R][2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int t = 0; t < kGroup; ++t) {
      const uint8_t* codes = b.v_codes + t * row_bytes + h * kGroupBytes;
      const __m512i x0 = load_bytes_twice(codes);
      const __m512i x1 = BITS == 4 ? load_bytes_twice(codes + 8) : x0;
#pragma GCC unroll 2
      for (int J = 0; J < 2; ++J) {
        const __m512 c = _mm512_cvtepi32_ps(_mm512_and_si512(J == 0 ? x0 : x1, mask[J]));
        const float* wt = opaque(w + t * n_groups + h);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          acc[r][J] = _mm512_fmadd_ps(_mm512_set1_ps(wt[r * dim]), c, acc[r][J]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 bv = _mm512_set1_ps(bias[r][h]);
#pragma GCC unroll 2
      for (int J = 0; J < 2; ++J) {
        float* dst = o + r * dim + h * kGroup + 16 * J;
        const __m512 add = _mm512_fmadd_ps(acc[r][J], unit[J], bv);
        _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_loadu_ps(dst), add));
      }
    }
  }
}
#pragma GCC diagnostic pop
#endif

#if KVBENCH_KIVI_INT8
// GCC 12's AVX-512 reductions and conversions pass self-initialized "undefined" vectors that
// its own warnings then report.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// ---- Int8 rows: llama.cpp's arithmetic against a quantized cache ------------------------------
//
// With int8 activations (AttentionQuery::rounding) a 4-bit block is read with integer dot
// products: per block, each row's multipliers of the codes are rounded to 8 bits against their
// largest magnitude (nearest, ties to even), as llama.cpp rounds q and the probabilities to
// q8_0 blocks of 32 against its own quantized caches: keys' q_d scale_d signed, per 32
// channels; values' p_t scale_th (never negative) unsigned, per group of 32 tokens. One
// vpdpbusd sums 4 codes times 4 multipliers in each of 16 lanes: a quarter of the fp32
// register path's FMAs. The minimums' share stays fp32. vpermt2b lays the codes out for it,
// 4 channels of a token (keys) or 4 tokens of a channel (values) a lane.

// Byte indices into (low nibbles | high nibbles) of 64 code bytes (_mm512_permutex2var_epi8).
struct Int8Layout {
  // [tokens 0-15, 16-31][4 t + c]: channel c of token t, from the 16-byte groups of channels
  // [4 g, 4 g + 4) (token t: nibble t % 2 of byte t / 2).
  uint8_t keys[2][64];
  // [positions 0-15, 16-31 of the group's permuted channels (element())][4 l + k]: that
  // channel of token k, from 4 tokens' 16-byte groups (channel e: nibble e % 2 of byte e / 2).
  uint8_t values[2][64];
};
constexpr Int8Layout make_int8_layout() {
  Int8Layout x{};
  for (int half = 0; half < 2; ++half) {
    for (int t = 0; t < 16; ++t) {
      const int token = 16 * half + t;
      for (int c = 0; c < 4; ++c) {
        x.keys[half][4 * t + c] = static_cast<uint8_t>(64 * (token % 2) + 16 * c + token / 2);
      }
    }
    for (int l = 0; l < 16; ++l) {
      const int p = 16 * half + l;
      const int e = element(4, p / 8, p % 8);
      for (int k = 0; k < 4; ++k) {
        x.values[half][4 * l + k] = static_cast<uint8_t>(64 * (e % 2) + 16 * k + e / 2);
      }
    }
  }
  return x;
}
constexpr Int8Layout kInt8Layout = make_int8_layout();

// As round_block_q8 (block_matvec_q8.h) for 32 values x >= 0, to unsigned codes 0 to 255:
// step max x / 255 (0 for all zeros).
inline float round_block_u8(const float* x, uint8_t* codes) {
  const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
  const float m = _mm512_reduce_max_ps(_mm512_max_ps(lo, hi));
  const __m512 inverse = _mm512_set1_ps(m > 0.0f ? 255.0f / m : 0.0f);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes),
                   _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(lo, inverse))));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16),
                   _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(hi, inverse))));
  return m / 255.0f;
}

// The lows and highs of 64 code bytes, a byte per code.
inline void split_nibbles(__m512i v, __m512i* lo, __m512i* hi) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  *lo = _mm512_and_si512(v, low4);
  *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
}

// As key_scores_from_codes (s rows kGroup apart, in token order), 4 bits: q * scale rounded
// per 32 channels, as llama.cpp's q8_0 blocks. qs, q8: [R, dim].
template <int R>
void key_scores_int8(const float* __restrict q, int dim, const BlockView& b, float* __restrict qs,
                     int8_t* __restrict q8, float* __restrict s) {
  const int n_groups = dim / kGroup;
  float step[R][8], bias[R];
  KVBENCH_UNROLL
  for (int r = 0; r < R; ++r) {
    __m512 acc = _mm512_setzero_ps();
    for (int d = 0; d < dim; d += 16) {
      const __m512 qv = _mm512_loadu_ps(q + r * dim + d);
      _mm512_storeu_ps(qs + r * dim + d, _mm512_mul_ps(qv, _mm512_loadu_ps(b.k_scale + d)));
      acc = _mm512_fmadd_ps(qv, _mm512_loadu_ps(b.k_min + d), acc);
    }
    bias[r] = _mm512_reduce_add_ps(acc);
    for (int g = 0; g < n_groups; ++g) {
      const int at = r * dim + g * kGroup;
      step[r][g] = round_block_q8(qs + at, q8 + at);
    }
  }
  const __m512i first = _mm512_loadu_si512(kInt8Layout.keys[0]);
  const __m512i second = _mm512_loadu_si512(kInt8Layout.keys[1]);
  __m512 sum[R][2];
  KVBENCH_UNROLL
  for (int r = 0; r < R; ++r) sum[r][0] = sum[r][1] = _mm512_set1_ps(bias[r]);
  for (int g = 0; g < n_groups; ++g) {
    __m512i acc[R][2];
    KVBENCH_UNROLL
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int c = g * kGroup; c < (g + 1) * kGroup; c += 4) {
      __m512i lo, hi;
      split_nibbles(_mm512_loadu_si512(b.k_codes + 16 * c), &lo, &hi);
      const __m512i w0 = _mm512_permutex2var_epi8(lo, first, hi);
      const __m512i w1 = _mm512_permutex2var_epi8(lo, second, hi);
      KVBENCH_UNROLL
      for (int r = 0; r < R; ++r) {
        acc[r][0] = dpbusd_broadcast(acc[r][0], w0, q8 + r * dim + c);
        acc[r][1] = dpbusd_broadcast(acc[r][1], w1, q8 + r * dim + c);
      }
    }
    KVBENCH_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_set1_ps(step[r][g]);
      sum[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), d, sum[r][0]);
      sum[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]), d, sum[r][1]);
    }
  }
  KVBENCH_UNROLL
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(s + r * kGroup, sum[r][0]);
    _mm512_storeu_ps(s + r * kGroup + 16, sum[r][1]);
  }
}

// Column h of 16 rows of a [16, G] array (a block's value scales or minimums): loads and
// permutes for G = 1 and 2 (head_dim 32 and 64), a gather beyond.
inline __m512 group_column(const float* x, int n_groups, int h) {
  if (n_groups == 1) return _mm512_loadu_ps(x);
  if (n_groups == 2) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(_mm512_loadu_ps(x), _mm512_add_epi32(even, _mm512_set1_epi32(h)),
                                  _mm512_loadu_ps(x + 16));
  }
  const __m512i at = _mm512_add_epi32(
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(n_groups)),
      _mm512_set1_epi32(h));
  return _mm512_i32gather_ps(at, x, 4);
}

// As values_from_codes (o in the permuted channel order, p rows kGroup apart), 4 bits.
// p8: [R, kGroup] scratch.
template <int R>
void values_int8(const float* __restrict p, int dim, const BlockView& b, uint8_t* __restrict p8,
                 float* __restrict o) {
  const int n_groups = dim / kGroup;
  const int row_bytes = dim / 2;
  const __m512i first = _mm512_loadu_si512(kInt8Layout.values[0]);
  const __m512i second = _mm512_loadu_si512(kInt8Layout.values[1]);
  for (int h = 0; h < n_groups; ++h) {
    // The group's scales and minimums of tokens [0, 16) and [16, 32).
    const __m512 scale0 = group_column(b.v_scale, n_groups, h);
    const __m512 scale1 = group_column(b.v_scale + 16 * n_groups, n_groups, h);
    const __m512 min0 = group_column(b.v_min, n_groups, h);
    const __m512 min1 = group_column(b.v_min + 16 * n_groups, n_groups, h);
    float step[R], bias[R];
    KVBENCH_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 p0 = _mm512_loadu_ps(p + r * kGroup), p1 = _mm512_loadu_ps(p + r * kGroup + 16);
      bias[r] = _mm512_reduce_add_ps(_mm512_fmadd_ps(p1, min1, _mm512_mul_ps(p0, min0)));
      alignas(64) float weights[kGroup];
      _mm512_store_ps(weights, _mm512_mul_ps(p0, scale0));
      _mm512_store_ps(weights + 16, _mm512_mul_ps(p1, scale1));
      step[r] = round_block_u8(weights, p8 + r * kGroup);
    }
    __m512i acc[R][2];
    KVBENCH_UNROLL
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int t = 0; t < kGroup; t += 4) {
      // Four tokens' 16 code bytes of group h.
      const uint8_t* codes = b.v_codes + t * row_bytes + h * 16;
      __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
      for (int k = 1; k < 4; ++k) {
        const __m128i more = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k * row_bytes));
        v = k == 1 ? _mm512_inserti32x4(v, more, 1)
                   : k == 2 ? _mm512_inserti32x4(v, more, 2) : _mm512_inserti32x4(v, more, 3);
      }
      __m512i lo, hi;
      split_nibbles(v, &lo, &hi);
      const __m512i w0 = _mm512_permutex2var_epi8(lo, first, hi);
      const __m512i w1 = _mm512_permutex2var_epi8(lo, second, hi);
      // The probabilities are the unsigned operand (8 bits, not 7), the codes the signed one.
      KVBENCH_UNROLL
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, p8 + r * kGroup + t, sizeof four);
        const __m512i pr = _mm512_set1_epi32(four);
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], pr, w0);
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], pr, w1);
      }
    }
    KVBENCH_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m512 d = _mm512_set1_ps(step[r]), bv = _mm512_set1_ps(bias[r]);
      float* dst = o + r * dim + h * kGroup;
      _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_loadu_ps(dst),
                                          _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), d, bv)));
      _mm512_storeu_ps(dst + 16, _mm512_add_ps(_mm512_loadu_ps(dst + 16),
                                               _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]), d, bv)));
    }
  }
}

using Int8ScoresKernel = void (*)(const float*, int, const BlockView&, float*, int8_t*, float*);
using Int8ValuesKernel = void (*)(const float*, int, const BlockView&, uint8_t*, float*);
constexpr Int8ScoresKernel kScoresInt8[kCodeRows] = {
    key_scores_int8<1>, key_scores_int8<2>, key_scores_int8<3>, key_scores_int8<4>,
    key_scores_int8<5>, key_scores_int8<6>, key_scores_int8<7>, key_scores_int8<8>};
constexpr Int8ValuesKernel kValuesInt8[kCodeRows] = {
    values_int8<1>, values_int8<2>, values_int8<3>, values_int8<4>,
    values_int8<5>, values_int8<6>, values_int8<7>, values_int8<8>};
#pragma GCC diagnostic pop
#endif

using ScoresKernel = void (*)(const float*, int, const BlockView&, float*, float*);
using ValuesKernel = void (*)(const float*, int, const BlockView&, float*, float*);

// [bits == 4][rows - 1]
#if KVBENCH_KIVI_ZMM
#define KIVI_ROWS(kernel, bits)                                                              \
  {kernel<1, bits>, kernel<2, bits>, kernel<3, bits>, kernel<4, bits>, kernel<5, bits>, \
   kernel<6, bits>, kernel<7, bits>, kernel<8, bits>}
constexpr ScoresKernel kScoresFromCodes[2][kCodeRows] = {
    KIVI_ROWS(key_scores_from_codes_zmm, 2), KIVI_ROWS(key_scores_from_codes_zmm, 4)};
constexpr ValuesKernel kValuesFromCodes[2][kCodeRows] = {KIVI_ROWS(values_from_codes_zmm, 2),
                                                         KIVI_ROWS(values_from_codes_zmm, 4)};
#undef KIVI_ROWS
#else
constexpr ScoresKernel kScoresFromCodes[2][kCodeRows] = {
    {key_scores_from_codes<1, 2>, key_scores_from_codes<2, 2>, key_scores_from_codes<3, 2>},
    {key_scores_from_codes<1, 4>, key_scores_from_codes<2, 4>, key_scores_from_codes<3, 4>}};
constexpr ValuesKernel kValuesFromCodes[2][kCodeRows] = {
    {values_from_codes<1, 2>, values_from_codes<2, 2>, values_from_codes<3, 2>},
    {values_from_codes<1, 4>, values_from_codes<2, 4>, values_from_codes<3, 4>}};
#endif
#endif

// Whether the register path applies: AVX2, few rows, head_dim / 32 dividing 8.
bool codes_in_registers(int rows, int dim) {
#if KVBENCH_AVX2
  const int n_groups = dim / kGroup;
  return rows <= kCodeRows && n_groups <= 8 && 8 % n_groups == 0;
#else
  (void)rows;
  (void)dim;
  return false;
#endif
}

// ---- Attending one block or tail tile of one KV head ------------------------------------------

// One KV head's query rows in a work item: its slice of the scratch rows.
struct HeadRows {
  int kvh;
  int rows;             // (queries in the tile) x (query heads per KV head)
  QueryRange queries;   // lowest and highest position among them
  float* q;             // [rows, head_dim]
  float* o;             // [rows, head_dim]
  float* m;             // [rows]
  float* l;             // [rows]
  const int32_t* qpos;  // [rows]
  bool int8;            // the query's rows run on int8 activations (AttentionQuery::rounding)
};

void scale_row(float* o, int n, float alpha) {
  for (int d = 0; d < n; ++d) o[d] *= alpha;
}

// Turns each row of scores s (masked ones -inf) into probabilities against the running max,
// rescaling the row's output and denominator.
void online_softmax(const HeadRows& h, float* s, int nk, int ld, int dim) {
  for (int r = 0; r < h.rows; ++r) {
    float* srow = s + static_cast<int64_t>(r) * ld;
    const float m_new = std::max(h.m[r], row_max(srow, nk));
    if (m_new == kNegInf) {  // nothing visible yet for this row
      std::fill(srow, srow + nk, 0.0f);
      continue;
    }
    const float alpha = std::exp2(h.m[r] - m_new);  // 0 when m was -inf
    const float sum = exp2_shift_sum(srow, nk, m_new);
    if (alpha != 1.0f) scale_row(h.o + static_cast<int64_t>(r) * dim, dim, alpha);
    h.l[r] = h.l[r] * alpha + sum;
    h.m[r] = m_new;
  }
}

// Puts each output row's channels back in order (blocks leave them as 32 h + 8 j + i).
void unpermute_output(const HeadRows& h, int dim, int bits) {
  float tmp[kGroup];
  for (int r = 0; r < h.rows; ++r) {
    for (int g = 0; g < dim / kGroup; ++g) {
      float* o = h.o + static_cast<int64_t>(r) * dim + g * kGroup;
      std::copy(o, o + kGroup, tmp);
      for (int j = 0; j < 4; ++j) {
        for (int i = 0; i < 8; ++i) o[element(bits, j, i)] = tmp[8 * j + i];
      }
    }
  }
}

// Asks for one KV head's block ahead of its use: the kernels read a block once, at a few
// hundred instructions a kilobyte, and the hardware prefetchers do not follow the head-strided
// block order, so without it the codes' loads waited on memory (the int8 kernels half the time).
void prefetch_block(const BlockView& b, int dim, int bits) {
  const auto lines = [](const void* p, int64_t bytes) {
    const char* c = static_cast<const char*>(p);
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
  };
  const int64_t code_bytes = static_cast<int64_t>(kGroup) * dim * bits / 8;
  lines(b.k_codes, code_bytes);
  lines(b.v_codes, code_bytes);
  lines(b.k_scale, dim * 4);
  lines(b.k_min, dim * 4);
  lines(b.v_scale, dim * 4);  // [32, dim / 32]
  lines(b.v_min, dim * 4);
  lines(b.positions, kGroup * 4);
}

// Lowest and highest position among the slots of a block that sel keeps.
std::pair<int32_t, int32_t> position_range(const int32_t* pos, uint32_t sel) {
  int32_t lo = std::numeric_limits<int32_t>::max(), hi = std::numeric_limits<int32_t>::min();
  if (sel == kAllSlots) {
#if KVBENCH_AVX2
    __m256i vlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pos)), vhi = vlo;
    for (int t = 8; t < kGroup; t += 8) {
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pos + t));
      vlo = _mm256_min_epi32(vlo, p);
      vhi = _mm256_max_epi32(vhi, p);
    }
    alignas(32) int32_t lanes_lo[8], lanes_hi[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_lo), vlo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_hi), vhi);
    return {*std::min_element(lanes_lo, lanes_lo + 8), *std::max_element(lanes_hi, lanes_hi + 8)};
#endif
  }
  for (int t = 0; t < kGroup; ++t) {
    if ((sel >> t) & 1u) {
      lo = std::min(lo, pos[t]);
      hi = std::max(hi, pos[t]);
    }
  }
  return {lo, hi};
}

// One block of one KV head: scores, causal and page masks, softmax, values. Output in
// permuted channels.
void attend_block(const KiviKv& kv, const Segment& seg, const HeadRows& h, Scratch& w) {
  const int dim = kv.tail.head_dim;
  const int rows = h.rows;
  const BlockView b = block_view(kv, seg.start / kGroup, h.kvh);
  const auto [pmin, pmax] = position_range(b.positions, seg.sel);
  if (pmin > h.queries.max) return;  // no row sees any selected slot: the codes are not read
  const bool masked = seg.sel != kAllSlots || pmax > h.queries.min;

  const bool direct = codes_in_registers(rows, dim);
#if KVBENCH_KIVI_INT8
  const bool int8 = direct && h.int8 && kv.bits == 4;
  if (int8) kScoresInt8[rows - 1](h.q, dim, b, w.qs.data(), w.q8.data(), w.s.data());
#else
  constexpr bool int8 = false;
#endif
#if KVBENCH_AVX2
  if (direct && !int8) {
    kScoresFromCodes[kv.bits == 4][rows - 1](h.q, dim, b, w.qs.data(), w.s.data());
  }
#endif
  if (!direct) {
    if (kv.bits == 4) {
      unpack_key_tile<4>(b, dim, w.kt.data());
    } else {
      unpack_key_tile<2>(b, dim, w.kt.data());
    }
    gemm(rows, dim, kGroup, h.q, dim, w.kt.data(), kGroup, w.s.data(), kGroup, false);
  }
  if (masked) {
    for (int r = 0; r < rows; ++r) {
      float* srow = w.s.data() + static_cast<int64_t>(r) * kGroup;
      for (int t = 0; t < kGroup; ++t) {
        if (!((seg.sel >> t) & 1u) || b.positions[t] > h.qpos[r]) srow[t] = kNegInf;
      }
    }
  }
  online_softmax(h, w.s.data(), kGroup, kGroup, dim);
#if KVBENCH_KIVI_INT8
  if (int8) {
    kValuesInt8[rows - 1](w.s.data(), dim, b, reinterpret_cast<uint8_t*>(w.q8.data()), h.o);
    return;
  }
#endif
#if KVBENCH_AVX2
  if (direct) {
    kValuesFromCodes[kv.bits == 4][rows - 1](w.s.data(), dim, b, w.vw.data(), h.o);
    return;
  }
#endif
  if (kv.bits == 4) {
    unpack_value_tile<4>(b, dim, w.vt.data());
  } else {
    unpack_value_tile<2>(b, dim, w.vt.data());
  }
  gemm(rows, kGroup, dim, w.s.data(), kGroup, w.vt.data(), dim, h.o, dim, true);
}

// Tail slots [a, a + n) (n <= kKeyTile) of one KV head, as attention_dense_cpu's tiles.
void attend_tail(const DenseKv& tail, int64_t a, int nk, const HeadRows& h, Scratch& w) {
  const int dim = tail.head_dim;
  const int rows = h.rows;
  const int32_t* pos = tail.positions + static_cast<int64_t>(h.kvh) * tail.capacity + a;
  const TileMask mask = tile_mask(pos, nk, h.queries);
  if (mask == TileMask::Skip) return;
  const float* k = tail.k + (static_cast<int64_t>(h.kvh) * tail.capacity + a) * dim;
  const float* v = tail.v + (static_cast<int64_t>(h.kvh) * tail.capacity + a) * dim;
  const int ld = (nk + kNr - 1) / kNr * kNr;
  if (rows <= kDirectRows) {
    scores_direct(rows, dim, h.q, k, nk, w.s.data(), ld);
  } else {
    pack_transposed(k, nk, dim, w.kt.data(), ld);
    gemm(rows, dim, ld, h.q, dim, w.kt.data(), ld, w.s.data(), ld, false);
  }
  if (mask == TileMask::Partial) {
    for (int r = 0; r < rows; ++r) {
      mask_after(w.s.data() + static_cast<int64_t>(r) * ld, pos, nk, h.qpos[r]);
    }
  }
  online_softmax(h, w.s.data(), nk, ld, dim);
  gemm(rows, nk, dim, w.s.data(), ld, v, dim, h.o, dim, true);
}

// ---- Segments and the work plan --------------------------------------------------------------

// Appends the segments covering slots [lo, hi) (global numbering) to out, merging with the
// last segment (if at or past out[head_begin], this head's) where it continues the same block
// or tail tile.
void add_slots(int64_t lo, int64_t hi, int64_t block_slots, size_t head_begin,
               std::vector<Segment>& out) {
  while (lo < hi) {
    if (lo < block_slots) {
      const int64_t start = lo / kGroup * kGroup;
      const int64_t end = std::min(hi, start + kGroup);
      const int first = static_cast<int>(lo - start), count = static_cast<int>(end - lo);
      const uint32_t bits = (count == kGroup ? kAllSlots : ((1u << count) - 1u)) << first;
      if (out.size() > head_begin && out.back().start == start) {
        out.back().sel |= bits;
      } else {
        out.push_back(Segment{start, kGroup, bits});
      }
      lo = end;
    } else {
      Segment* last = out.size() > head_begin ? &out.back() : nullptr;
      if (last && last->start >= block_slots && last->start + last->len == lo &&
          last->len < kKeyTile) {
        const int64_t end = std::min(hi, lo + (kKeyTile - last->len));
        last->len += static_cast<int32_t>(end - lo);
        lo = end;
      } else {
        const int64_t end = std::min(hi, lo + kKeyTile);
        out.push_back(Segment{lo, static_cast<int32_t>(end - lo), 0u});
        lo = end;
      }
    }
  }
}

// Work items are (group of KV heads, query tile, split of the segments). Without a page
// selection every head reads the same segments and an item takes all heads, so it walks the
// block-major arrays in order; with one, each head has its own segments and item.
struct Plan {
  int group;          // query heads per KV head
  int item_heads;     // KV heads per work item
  int n_head_groups;  // n_kv_heads / item_heads
  int q_tile;         // queries per work item
  int n_q_tiles;
  int n_splits;
  int head_rows;                   // q_tile * group: rows per KV head
  int item_rows;                   // head_rows * item_heads
  std::vector<Segment> segments;   // one shared list, or every head's one after another
  std::vector<int64_t> seg_begin;  // [n_kv_heads]: head h reads segments [seg_begin[h],
  std::vector<int64_t> seg_end;    //   seg_end[h])
};

Plan make_plan(const AttentionQuery& query, const KiviKv& kv, const PageSelection* pages,
               int threads) {
  Plan p;
  const int n_kv_heads = kv.tail.n_kv_heads;
  const int64_t block_slots = kv.n_blocks * kGroup;
  const int64_t n_total = block_slots + kv.tail.n_tokens;
  p.group = query.n_heads / n_kv_heads;
  p.item_heads = pages == nullptr && n_kv_heads <= kMaxItemHeads ? n_kv_heads : 1;
  p.n_head_groups = n_kv_heads / p.item_heads;
  p.q_tile = std::max(1, std::min<int>(query.n_queries, kTileRows / (p.group * p.item_heads)));
  p.n_q_tiles = (query.n_queries + p.q_tile - 1) / p.q_tile;
  p.head_rows = p.q_tile * p.group;
  p.item_rows = p.head_rows * p.item_heads;
  if (pages == nullptr) {
    add_slots(0, n_total, block_slots, 0, p.segments);
    p.seg_begin.assign(n_kv_heads, 0);
    p.seg_end.assign(n_kv_heads, static_cast<int64_t>(p.segments.size()));
  } else {
    std::vector<int32_t> selected;
    for (int h = 0; h < n_kv_heads; ++h) {
      const size_t head_begin = p.segments.size();
      const int32_t* first = pages->pages + static_cast<int64_t>(h) * pages->n_selected;
      selected.assign(first, first + pages->n_selected);
      std::sort(selected.begin(), selected.end());
      selected.erase(std::unique(selected.begin(), selected.end()), selected.end());
      for (int32_t page : selected) {
        if (page < 0) continue;
        const int64_t lo = static_cast<int64_t>(page) * pages->page_tokens;
        add_slots(lo, std::min(n_total, lo + pages->page_tokens), block_slots, head_begin,
                  p.segments);
      }
      p.seg_begin.push_back(static_cast<int64_t>(head_begin));
      p.seg_end.push_back(static_cast<int64_t>(p.segments.size()));
    }
  }
  // Split-K (flash-decoding) when there are too few work items to keep every thread busy.
  int64_t most = 0;
  for (int h = 0; h < n_kv_heads; ++h) most = std::max(most, p.seg_end[h] - p.seg_begin[h]);
  const int64_t items = static_cast<int64_t>(p.n_head_groups) * p.n_q_tiles;
  const int64_t want = 8LL * threads;
  int64_t splits = 1;
  if (items < want) {
    splits = std::min<int64_t>((want + items - 1) / items,
                               most * kGroup * p.item_heads / kMinSplitSlots);
    splits = std::max<int64_t>(splits, 1);
  }
  p.n_splits = static_cast<int>(splits);
  return p;
}

// One work item: query tile [q0, q1) of KV heads [h0, h0 + plan.item_heads), each over its
// segments' share `split`. Leaves unnormalised o, m, l per row (head, query, head-in-group)
// in the scratch buffers.
void attend_item(const AttentionQuery& query, const KiviKv& kv, const Plan& plan, int h0, int q0,
                 int q1, int split, Scratch& w) {
  const int dim = kv.tail.head_dim;
  const int64_t block_slots = kv.n_blocks * kGroup;
  const int rows = (q1 - q0) * plan.group;
  HeadRows heads[kMaxItemHeads];
  const int n_heads = plan.item_heads;
  for (int hh = 0; hh < n_heads; ++hh) {
    const int64_t first = static_cast<int64_t>(hh) * plan.head_rows;
    HeadRows& h = heads[hh];
    h.kvh = h0 + hh;
    h.rows = rows;
    h.q = w.q.data() + first * dim;
    h.o = w.o.data() + first * dim;
    h.m = w.m.data() + first;
    h.l = w.l.data() + first;
    h.qpos = w.qpos.data() + first;
    h.int8 = query.rounding == QueryRounding::Int8;
    h.queries = gather_query_rows(query, h.kvh, plan.group, dim, q0, q1, query.scale * kLog2e, h.q,
                                  w.qpos.data() + first);
    std::fill(h.o, h.o + static_cast<int64_t>(rows) * dim, 0.0f);
    std::fill(h.m, h.m + rows, kNegInf);
    std::fill(h.l, h.l + rows, 0.0f);
  }
  // The heads of an item read the same segments (several heads only with the shared list).
  const int64_t begin = plan.seg_begin[h0], count = plan.seg_end[h0] - begin;
  const int64_t s0 = count * split / plan.n_splits, s1 = count * (split + 1) / plan.n_splits;
  bool permuted = false;
  for (int64_t i = s0; i < s1; ++i) {
    const Segment& seg = plan.segments[begin + i];
    if (seg.start < block_slots) {
#if KVBENCH_AVX2
      if (i + 1 < s1 && plan.segments[begin + i + 1].start < block_slots) {
        for (int hh = 0; hh < n_heads; ++hh) {
          prefetch_block(block_view(kv, plan.segments[begin + i + 1].start / kGroup, heads[hh].kvh),
                         dim, kv.bits);
        }
      }
#endif
      for (int hh = 0; hh < n_heads; ++hh) attend_block(kv, seg, heads[hh], w);
      permuted = true;
    } else {
      if (permuted) {
        for (int hh = 0; hh < n_heads; ++hh) unpermute_output(heads[hh], dim, kv.bits);
      }
      permuted = false;
      for (int hh = 0; hh < n_heads; ++hh) {
        attend_tail(kv.tail, seg.start - block_slots, seg.len, heads[hh], w);
      }
    }
  }
  if (permuted) {
    for (int hh = 0; hh < n_heads; ++hh) unpermute_output(heads[hh], dim, kv.bits);
  }
}

}  // namespace

bool kivi_int8_rows_supported() {
#if KVBENCH_KIVI_INT8
  return true;
#else
  return false;
#endif
}

void attention_kivi_cpu(const AttentionQuery& query, const KiviKv& kv, const PageSelection* pages) {
  const int dim = kv.tail.head_dim;
  assert(query.n_heads % kv.tail.n_kv_heads == 0);
  assert(kv.group == kGroup && dim % kGroup == 0 && (kv.bits == 2 || kv.bits == 4));
  if (query.n_queries <= 0) return;
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const Plan plan = make_plan(query, kv, pages, threads);
  const int64_t n_items = static_cast<int64_t>(plan.n_head_groups) * plan.n_q_tiles * plan.n_splits;
  // Partials of split-K items: [item][item rows][dim + 2] holding o, then m and l.
  const int64_t part_stride = static_cast<int64_t>(plan.item_rows) * (dim + 2);
  std::vector<float> partial;
  if (plan.n_splits > 1) partial.resize(n_items * part_stride);
  // Item row r is KV head h0 + r / head_rows, query q0 + (r % head_rows) / group.
  const auto out_row = [&](int h0, int q0, int r) -> float* {
    const int hh = r / plan.head_rows, rr = r % plan.head_rows;
    const int i = q0 + rr / plan.group;
    const int h = (h0 + hh) * plan.group + rr % plan.group;
    return i < query.n_queries ? query.out + (static_cast<int64_t>(i) * query.n_heads + h) * dim
                               : nullptr;
  };

#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t item = 0; item < n_items; ++item) {
    static thread_local Scratch w;
    ensure(w, plan.item_rows, plan.head_rows, dim);
    // Later query tiles see more slots: start them first for a better dynamic balance.
    const int split = static_cast<int>(item % plan.n_splits);
    const int64_t rest = item / plan.n_splits;
    const int h0 = static_cast<int>(rest % plan.n_head_groups) * plan.item_heads;
    const int tile = plan.n_q_tiles - 1 - static_cast<int>(rest / plan.n_head_groups);
    const int q0 = tile * plan.q_tile;
    const int q1 = std::min(query.n_queries, q0 + plan.q_tile);
    attend_item(query, kv, plan, h0, q0, q1, split, w);
    for (int r = 0; r < plan.item_rows; ++r) {
      const float* o = w.o.data() + static_cast<int64_t>(r) * dim;
      if (plan.n_splits == 1) {
        float* out = out_row(h0, q0, r);
        if (out == nullptr) continue;
        const float inv = w.l[r] > 0.0f ? 1.0f / w.l[r] : 0.0f;  // no visible slot: zeros
        for (int d = 0; d < dim; ++d) out[d] = o[d] * inv;
      } else {
        float* dst = partial.data() + item * part_stride + static_cast<int64_t>(r) * (dim + 2);
        std::copy(o, o + dim, dst);
        dst[dim] = w.m[r];
        dst[dim + 1] = w.l[r];
      }
    }
  }
  if (plan.n_splits == 1) return;

  // Merge the splits of each row: rescale every partial to the common max.
  const int64_t n_rows = static_cast<int64_t>(plan.n_head_groups) * plan.n_q_tiles * plan.item_rows;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t row = 0; row < n_rows; ++row) {
    const int r = static_cast<int>(row % plan.item_rows);
    const int64_t rest = row / plan.item_rows;
    const int h0 = static_cast<int>(rest % plan.n_head_groups) * plan.item_heads;
    const int tile = plan.n_q_tiles - 1 - static_cast<int>(rest / plan.n_head_groups);
    float* out = out_row(h0, tile * plan.q_tile, r);
    if (out == nullptr) continue;
    const float* first =
        partial.data() + rest * plan.n_splits * part_stride + static_cast<int64_t>(r) * (dim + 2);
    merge_split_partials(first, plan.n_splits, part_stride, dim, out);
  }
}

void attention_kivi_reference(const AttentionQuery& query, const KiviKv& kv,
                              const PageSelection* pages) {
  const int dim = kv.tail.head_dim;
  const int n_kv_heads = kv.tail.n_kv_heads;
  const int group = query.n_heads / n_kv_heads;
  const int n_groups = dim / kv.group;
  const int64_t block_slots = kv.n_blocks * kv.group;
  const int64_t n_total = block_slots + kv.tail.n_tokens;
  const int64_t code_bytes = static_cast<int64_t>(kv.group) * dim * kv.bits / 8;
  // One KV head at a time (each may keep different pages): its slots dequantized into a dense
  // one-head KV, in slot order, then the dense reference over that head's query heads.
  std::vector<float> k_all(static_cast<size_t>(n_total * dim)), v_all(k_all.size());
  std::vector<int32_t> pos_all(static_cast<size_t>(n_total));
  std::vector<float> k, v, q(static_cast<size_t>(query.n_queries) * group * dim), out(q.size());
  std::vector<int32_t> pos;
  std::vector<char> keep(static_cast<size_t>(n_total));
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int64_t b = 0; b < kv.n_blocks; ++b) {
      const int64_t blk = b * n_kv_heads + h;
      float* k_slab = k_all.data() + b * kv.group * dim;
      float* v_slab = v_all.data() + b * kv.group * dim;
      // Keys: one group per channel (element stride head_dim); values: per token and 32 channels.
      const QuantGroups keys{const_cast<uint8_t*>(kv.k_codes + blk * code_bytes),
                             const_cast<float*>(kv.k_scale + blk * dim),
                             const_cast<float*>(kv.k_min + blk * dim),
                             dim,
                             kv.group,
                             kv.bits};
      const QuantGroups values{const_cast<uint8_t*>(kv.v_codes + blk * code_bytes),
                               const_cast<float*>(kv.v_scale + blk * kv.group * n_groups),
                               const_cast<float*>(kv.v_min + blk * kv.group * n_groups),
                               static_cast<int64_t>(kv.group) * n_groups,
                               kv.group,
                               kv.bits};
      dequantize_groups_reference(keys, k_slab, 1, dim);
      dequantize_groups_reference(values, v_slab, kv.group, 1);
      std::copy(kv.positions + blk * kv.group, kv.positions + (blk + 1) * kv.group,
                pos_all.begin() + b * kv.group);
    }
    const DenseKv& tail = kv.tail;
    for (int64_t t = 0; t < tail.n_tokens; ++t) {
      const int64_t src = (h * tail.capacity + t) * dim;
      std::copy(tail.k + src, tail.k + src + dim, k_all.begin() + (block_slots + t) * dim);
      std::copy(tail.v + src, tail.v + src + dim, v_all.begin() + (block_slots + t) * dim);
      pos_all[block_slots + t] = tail.positions[h * tail.capacity + t];
    }
    std::fill(keep.begin(), keep.end(), pages == nullptr ? 1 : 0);
    if (pages != nullptr) {
      for (int32_t i = 0; i < pages->n_selected; ++i) {
        const int64_t page = pages->pages[static_cast<int64_t>(h) * pages->n_selected + i];
        for (int64_t t = page * pages->page_tokens;
             t < std::min(n_total, (page + 1) * pages->page_tokens); ++t) {
          if (t >= 0) keep[t] = 1;
        }
      }
    }
    k.clear();
    v.clear();
    pos.clear();
    for (int64_t t = 0; t < n_total; ++t) {
      if (!keep[t]) continue;
      k.insert(k.end(), k_all.begin() + t * dim, k_all.begin() + (t + 1) * dim);
      v.insert(v.end(), v_all.begin() + t * dim, v_all.begin() + (t + 1) * dim);
      pos.push_back(pos_all[t]);
    }
    const int64_t n_kept = static_cast<int64_t>(pos.size());
    const DenseKv one_head{k.data(), v.data(), pos.data(), 1, dim, n_kept, n_kept};
    for (int i = 0; i < query.n_queries; ++i) {
      const float* src = query.q + (static_cast<int64_t>(i) * query.n_heads + h * group) * dim;
      std::copy(src, src + group * dim, q.begin() + static_cast<int64_t>(i) * group * dim);
    }
    const AttentionQuery one{q.data(), query.q_positions, out.data(), query.n_queries,
                             group,    query.scale};
    attention_dense_reference(one, one_head);
    for (int i = 0; i < query.n_queries; ++i) {
      float* dst = query.out + (static_cast<int64_t>(i) * query.n_heads + h * group) * dim;
      std::copy(out.begin() + static_cast<int64_t>(i) * group * dim,
                out.begin() + static_cast<int64_t>(i + 1) * group * dim, dst);
    }
  }
}

}  // namespace kvbench
