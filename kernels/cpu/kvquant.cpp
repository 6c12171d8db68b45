#include "kernels/cpu/kvquant.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/narrow.h"

namespace kvbench {
namespace {

constexpr int kMaxPairs = 512;  // head_dim 1024, as rope_interleaved_cpu's tables

// The code of x in [0, levels], rounded half to even and clamped, as quantize_groups_cpu.
inline uint32_t code_of(float x, float min, float scale, uint32_t levels) {
  if (!(scale > 0.0f)) return 0;
  const float c = std::nearbyint((x - min) * (1.0f / scale));
  return static_cast<uint32_t>(std::clamp(c, 0.0f, static_cast<float>(levels)));
}

// Eight codes of `bits` into `bits` bytes, low bits first.
inline void pack8(const uint32_t* codes, int bits, uint8_t* out) {
  uint32_t word = 0;
  for (int i = 0; i < 8; ++i) word |= codes[i] << (i * bits);
  for (int b = 0; b < bits; ++b) out[b] = static_cast<uint8_t>(word >> (8 * b));
}

// A row's codes as floats; eight codes fill BITS bytes.
template <int BITS>
void unpack_row(const uint8_t* codes, int dim, float* out) {
  constexpr uint32_t mask = (1u << BITS) - 1;
  for (int g = 0; g < dim / 8; ++g) {
    uint32_t word = 0;
    for (int b = 0; b < BITS; ++b) word |= static_cast<uint32_t>(codes[g * BITS + b]) << (8 * b);
    for (int i = 0; i < 8; ++i) out[g * 8 + i] = static_cast<float>((word >> (i * BITS)) & mask);
  }
}

using UnpackRow = void (*)(const uint8_t*, int, float*);

UnpackRow unpack_for(int bits) {
  static constexpr UnpackRow table[] = {unpack_row<2>, unpack_row<3>, unpack_row<4>};
  assert(bits >= 2 && bits <= 4);
  return table[bits - 2];
}

// cos and sin of position * inv_freq[i] for every pair, position in [0, 2^24): the three
// digits' angles summed by complex products in double (a digit 0 is (1, 0), exact).
void angles_at(const RopeAngles& rope, uint32_t position, float* cos_sin) {
  assert(position < (1u << 24));
  const int32_t np = rope.n_pairs;
  const double* lo = rope.cos_sin + (0 * 256 + (position & 255)) * np * 2;
  const double* mid = rope.cos_sin + (1 * 256 + ((position >> 8) & 255)) * np * 2;
  const double* hi = rope.cos_sin + (2 * 256 + (position >> 16)) * np * 2;
  for (int32_t i = 0; i < np; ++i) {
    const double c1 = lo[2 * i] * mid[2 * i] - lo[2 * i + 1] * mid[2 * i + 1];
    const double s1 = lo[2 * i] * mid[2 * i + 1] + lo[2 * i + 1] * mid[2 * i];
    cos_sin[2 * i] = static_cast<float>(c1 * hi[2 * i] - s1 * hi[2 * i + 1]);
    cos_sin[2 * i + 1] = static_cast<float>(c1 * hi[2 * i + 1] + s1 * hi[2 * i]);
  }
}

}  // namespace

void fill_rope_angles(const float* inv_freq, int32_t n_pairs, double* cos_sin) {
  for (int level = 0; level < 3; ++level) {
    for (int digit = 0; digit < 256; ++digit) {
      const double steps = static_cast<double>(digit) * static_cast<double>(1 << (8 * level));
      for (int32_t i = 0; i < n_pairs; ++i) {
        const double angle = steps * static_cast<double>(inv_freq[i]);
        double* at = cos_sin + ((level * 256 + digit) * n_pairs + i) * 2;
        at[0] = std::cos(angle);
        at[1] = std::sin(angle);
      }
    }
  }
}

void rotate_rows(const RopeAngles& rope, float* x, int64_t stride, const int32_t* positions,
                 int64_t n, int32_t sign) {
  assert(rope.n_pairs <= kMaxPairs);
  float cos_sin[2 * kMaxPairs];
  for (int64_t r = 0; r < n; ++r) {
    const int64_t turn = static_cast<int64_t>(sign) * positions[r];
    angles_at(rope, static_cast<uint32_t>(std::llabs(turn)), cos_sin);
    const float flip = turn < 0 ? -1.0f : 1.0f;  // sin(-a) = -sin(a)
    float* row = x + r * stride;
    for (int32_t i = 0; i < rope.n_pairs; ++i) {
      const float c = cos_sin[2 * i], s = flip * cos_sin[2 * i + 1];
      const float x0 = row[2 * i], x1 = row[2 * i + 1];
      row[2 * i] = x0 * c - x1 * s;
      row[2 * i + 1] = x0 * s + x1 * c;
    }
  }
}

int32_t kvquant_encode_row(const KvQuantEncoding& enc, const float* k, const float* v, bool whole,
                           uint8_t* k_codes, uint8_t* v_codes, float* v_scale, float* v_min,
                           uint16_t* channels, uint16_t* values) {
  const int32_t dim = enc.head_dim, bits = enc.bits;
  const uint32_t levels = (1u << bits) - 1;
  const int64_t row_bytes = static_cast<int64_t>(dim) * bits / 8;
  if (whole) {  // every element apart: the codes are never read
    std::fill(k_codes, k_codes + row_bytes, 0);
    std::fill(v_codes, v_codes + row_bytes, 0);
    *v_scale = *v_min = 0.0f;
    for (int32_t c = 0; c < 2 * dim; ++c) {
      channels[c] = static_cast<uint16_t>(c);
      values[c] = float_to_half_bits(c < dim ? k[c] : v[c - dim]);
    }
    return 2 * dim;
  }
  int32_t n_out = 0;
  uint32_t codes[8];
  // Keys: outside the channel's range a value is kept apart (KVQuant's per-channel
  // thresholds), its code 0.
  for (int32_t g = 0; g < dim / 8; ++g) {
    for (int i = 0; i < 8; ++i) {
      const int32_t c = g * 8 + i;
      if (k[c] < enc.k_min[c] || k[c] > enc.k_max[c]) {
        channels[n_out] = static_cast<uint16_t>(c);
        values[n_out++] = float_to_half_bits(k[c]);
        codes[i] = 0;
      } else {
        codes[i] = code_of(k[c], enc.k_min[c], enc.k_scale[c], levels);
      }
    }
    pack8(codes, bits, k_codes + g * bits);
  }
  // Values: the row's value_outliers smallest and largest kept apart, the rest quantized
  // between their own minimum and maximum.
  static thread_local std::vector<int32_t> order;
  static thread_local std::vector<char> apart;
  order.resize(dim);
  apart.assign(dim, 0);
  std::iota(order.begin(), order.end(), 0);
  const int32_t side = std::min(enc.value_outliers, dim / 2);
  if (side > 0) {
    const auto less = [&](int32_t a, int32_t b) { return v[a] < v[b] || (v[a] == v[b] && a < b); };
    std::nth_element(order.begin(), order.begin() + side, order.end(), less);
    std::nth_element(order.begin() + side, order.end() - side, order.end(), less);
    for (int32_t j = 0; j < side; ++j) apart[order[j]] = apart[order[dim - 1 - j]] = 1;
  }
  float lo = 0.0f, hi = 0.0f;
  bool any = false;
  for (int32_t c = 0; c < dim; ++c) {
    if (apart[c]) continue;
    lo = any ? std::min(lo, v[c]) : v[c];
    hi = any ? std::max(hi, v[c]) : v[c];
    any = true;
  }
  const float scale = (hi - lo) / static_cast<float>(levels);
  *v_scale = scale;
  *v_min = lo;
  for (int32_t g = 0; g < dim / 8; ++g) {
    for (int i = 0; i < 8; ++i) {
      const int32_t c = g * 8 + i;
      if (apart[c]) {
        channels[n_out] = static_cast<uint16_t>(dim + c);
        values[n_out++] = float_to_half_bits(v[c]);
        codes[i] = 0;
      } else {
        codes[i] = code_of(v[c], lo, scale, levels);
      }
    }
    pack8(codes, bits, v_codes + g * bits);
  }
  return n_out;
}

void kvquant_decode_rows(const KvQuantKv& kv, int32_t kvh, int64_t start, int32_t n, float* k,
                         float* v, int32_t* positions) {
  const int32_t dim = kv.head_dim;
  const int64_t row_bytes = static_cast<int64_t>(dim) * kv.bits / 8;
  const int64_t head = static_cast<int64_t>(kvh) * kv.capacity;
  const float* k_min = kv.k_min + static_cast<int64_t>(kvh) * dim;
  const float* k_scale = kv.k_scale + static_cast<int64_t>(kvh) * dim;
  const SparseRows& apart = kv.outliers[kvh];
  const UnpackRow unpack = unpack_for(kv.bits);
  for (int32_t r = 0; r < n; ++r) {
    const int64_t slot = head + start + r;
    float* kr = k + static_cast<int64_t>(r) * dim;
    float* vr = v + static_cast<int64_t>(r) * dim;
    unpack(kv.k_codes + slot * row_bytes, dim, kr);
    unpack(kv.v_codes + slot * row_bytes, dim, vr);
    for (int32_t c = 0; c < dim; ++c) kr[c] = std::fma(kr[c], k_scale[c], k_min[c]);
    const float vs = kv.v_scale[slot], vm = kv.v_min[slot];
    for (int32_t c = 0; c < dim; ++c) vr[c] = std::fma(vr[c], vs, vm);
    for (int32_t e = apart.start[start + r]; e < apart.start[start + r + 1]; ++e) {
      const int32_t c = apart.channel[e];
      (c < dim ? kr[c] : vr[c - dim]) = half_to_float(apart.value[e]);
    }
    positions[r] = kv.positions[slot];
  }
  rotate_rows(kv.rope, k, dim, positions, n, 1);
}

void attention_kvquant_cpu(const AttentionQuery& query, const KvQuantKv& kv,
                           const PageSelection* pages) {
  attention_decoded_cpu(
      query, kv.n_kv_heads, kv.head_dim, kv.n_tokens, pages,
      [&](int32_t kvh, int64_t start, int32_t n, float* k, float* v, int32_t* positions) {
        kvquant_decode_rows(kv, kvh, start, n, k, v, positions);
      });
}

void attention_kvquant_reference(const AttentionQuery& query, const KvQuantKv& kv,
                                 const PageSelection* pages) {
  const int64_t n = kv.n_tokens, dim = kv.head_dim;
  std::vector<float> k(kv.n_kv_heads * n * dim), v(k.size());
  std::vector<int32_t> positions(kv.n_kv_heads * n);
  for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {  // one row at a time: nothing shared with the kernel's tiles
      kvquant_decode_rows(kv, h, t, 1, &k[(h * n + t) * dim], &v[(h * n + t) * dim],
                          &positions[h * n + t]);
    }
  }
  const DenseKv dense{k.data(), v.data(), positions.data(), kv.n_kv_heads, kv.head_dim, n, n};
  pages ? attention_pages_reference(query, dense, *pages) : attention_dense_reference(query, dense);
}

}  // namespace kvbench
