#include "harness/model/dequant.h"

#include <cstring>
#include <string>

#include "kernels/cpu/half.h"

// Every product of an fp16 scale and a quant fits in float's 24-bit mantissa, so a fused
// multiply-add gives the same bits as ggml's separate multiply and add.

namespace kvbench {

namespace {

constexpr int kQK = 32;    // elements per Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 block
constexpr int kQKK = 256;  // elements per K-quant super-block

// Block layouts as in ggml-common.h (all fields byte-packed without padding; fp16 values are
// raw uint16 bits).
struct BlockQ4_0 {
  uint16_t d;           // fp16 scale
  uint8_t qs[kQK / 2];  // element j in the low nibble of qs[j], j + 16 in the high nibble
};
struct BlockQ4_1 {
  uint16_t d;           // fp16 scale
  uint16_t m;           // fp16 minimum
  uint8_t qs[kQK / 2];  // nibbles as in Q4_0, unsigned
};
struct BlockQ5_0 {
  uint16_t d;           // fp16 scale
  uint8_t qh[4];        // fifth bits: bit j of element j (j < 32), little-endian
  uint8_t qs[kQK / 2];  // low four bits as Q4_0's nibbles
};
struct BlockQ5_1 {
  uint16_t d;           // fp16 scale
  uint16_t m;           // fp16 minimum
  uint8_t qh[4];        // fifth bits as in Q5_0
  uint8_t qs[kQK / 2];  // low four bits as Q4_0's nibbles, unsigned
};
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQK];
};
struct BlockQ4_K {
  uint16_t d;            // fp16 super-block scale for the 6-bit scales
  uint16_t dmin;         // fp16 super-block scale for the 6-bit minimums
  uint8_t scales[12];    // 8 scales + 8 minimums, 6 bits each
  uint8_t qs[kQKK / 2];  // 4-bit quants, 64 elements per 32 bytes
};
struct BlockQ5_K {
  uint16_t d;            // fp16 super-block scale for the 6-bit scales
  uint16_t dmin;         // fp16 super-block scale for the 6-bit minimums
  uint8_t scales[12];    // as Q4_K's
  uint8_t qh[kQKK / 8];  // fifth bits: bit 2c of qh[l] for chunk c's low nibbles, 2c+1 high
  uint8_t qs[kQKK / 2];  // low four bits as Q4_K's
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];  // low 4 bits
  uint8_t qh[kQKK / 4];  // high 2 bits
  int8_t scales[kQKK / 16];
  uint16_t d;  // fp16 super-block scale
};
static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block is 18 bytes");
static_assert(sizeof(BlockQ4_1) == 20, "Q4_1 block is 20 bytes");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block is 22 bytes");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block is 24 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block is 176 bytes");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block is 144 bytes");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block is 210 bytes");

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Blocks in a mapped file are only byte-aligned, so they are copied out before use.
template <typename Block>
Block load_block(const uint8_t* src, int64_t index) {
  Block b;
  std::memcpy(&b, src + index * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}

void dequant_f32(const uint8_t* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequant_f16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = fp16_to_fp32(h);
  }
}

void dequant_bf16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = bf16_to_fp32(h);
  }
}

void dequant_q4_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    float* y = dst + i * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b.qs[j] & 0x0F) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    float* y = dst + i * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b.qs[j] & 0x0F) * d + m;
      y[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
  }
}

// The 5-bit quant of element j of a Q5_0/Q5_1 block (0..31): element j < 16 is the low
// nibble of qs[j] with bit j of qh on top, element j + 16 the high nibble with bit j + 16.
uint32_t q5_bits(const uint8_t qh[4]) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

void dequant_q5_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    const uint32_t qh = q5_bits(b.qh);
    float* y = dst + i * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = static_cast<int>((b.qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
      const int hi = static_cast<int>((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
      y[j] = static_cast<float>(lo) * d;
      y[j + kQK / 2] = static_cast<float>(hi) * d;
    }
  }
}

void dequant_q5_1(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = fp16_to_fp32(b.d);
    const float m = fp16_to_fp32(b.m);
    const uint32_t qh = q5_bits(b.qh);
    float* y = dst + i * kQK;
    for (int j = 0; j < kQK / 2; ++j) {
      const uint32_t lo = (b.qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
      const uint32_t hi = (b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + kQK / 2] = static_cast<float>(hi) * d + m;
    }
  }
}

void dequant_q8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = fp16_to_fp32(b.d);
    float* y = dst + i * kQK;
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
  }
}

// Q4_K packs eight 6-bit (scale, min) pairs into 12 bytes: pairs 0-3 sit in the low six
// bits of bytes 0-3 (scales) and 4-7 (mins); pairs 4-7 take their low four bits from
// bytes 8-11 and their top two bits from the spare high bits of bytes 0-7.
void q4_k_scale_min(int j, const uint8_t* s, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// One Q4_K or Q5_K super-block: each 64-element chunk uses 32 bytes of qs, low nibbles then
// high nibbles, each half with its own (scale, min) pair. Q5_K's fifth bits (qh, or nullptr
// for Q4_K) are bits 2c (low nibbles) and 2c + 1 (high nibbles) of qh[l] in chunk c.
void dequant_k_super_block(float d, float dmin, const uint8_t* scales, const uint8_t* qs,
                           const uint8_t* qh, float* y) {
  for (int chunk = 0; chunk < kQKK / 64; ++chunk) {
    uint8_t sc, mn;
    q4_k_scale_min(2 * chunk, scales, &sc, &mn);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(mn);
    q4_k_scale_min(2 * chunk + 1, scales, &sc, &mn);
    const float d2 = d * static_cast<float>(sc);
    const float m2 = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l) {
      const int fifth_lo = qh ? ((qh[l] >> (2 * chunk)) & 1) << 4 : 0;
      const int fifth_hi = qh ? ((qh[l] >> (2 * chunk + 1)) & 1) << 4 : 0;
      y[l] = d1 * static_cast<float>((qs[l] & 0x0F) + fifth_lo) - m1;
      y[32 + l] = d2 * static_cast<float>((qs[l] >> 4) + fifth_hi) - m2;
    }
    y += 64;
    qs += 32;
  }
}

void dequant_q4_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const auto b = load_block<BlockQ4_K>(src, i);
    dequant_k_super_block(fp16_to_fp32(b.d), fp16_to_fp32(b.dmin), b.scales, b.qs, nullptr,
                          dst + i * kQKK);
  }
}

void dequant_q5_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const auto b = load_block<BlockQ5_K>(src, i);
    dequant_k_super_block(fp16_to_fp32(b.d), fp16_to_fp32(b.dmin), b.scales, b.qs, b.qh,
                          dst + i * kQKK);
  }
}

void dequant_q6_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQKK; ++i) {
    const auto b = load_block<BlockQ6_K>(src, i);
    const float d = fp16_to_fp32(b.d);
    float* y = dst + i * kQKK;
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    // Each 128-element half uses 64 ql bytes, 32 qh bytes and 8 scales (one per 16 values).
    for (int half = 0; half < kQKK / 128; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

using DequantFn = void (*)(const uint8_t*, float*, int64_t);

struct DequantEntry {
  GgmlType type;
  DequantFn fn;
};

constexpr DequantEntry kDequantTable[] = {
    {GgmlType::F32, dequant_f32},   {GgmlType::F16, dequant_f16},   {GgmlType::BF16, dequant_bf16},
    {GgmlType::Q4_0, dequant_q4_0}, {GgmlType::Q4_1, dequant_q4_1}, {GgmlType::Q8_0, dequant_q8_0},
    {GgmlType::Q5_0, dequant_q5_0}, {GgmlType::Q5_1, dequant_q5_1}, {GgmlType::Q4_K, dequant_q4_k},
    {GgmlType::Q5_K, dequant_q5_k}, {GgmlType::Q6_K, dequant_q6_k},
};

}  // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  for (const DequantEntry& e : kDequantTable) {
    if (e.type == type) {
      e.fn(static_cast<const uint8_t*>(src), dst, n);
      return;
    }
  }
  throw InputError("cannot dequantize tensor type " + std::to_string(static_cast<uint32_t>(type)) +
                   " (expected F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K)");
}

float fp16_to_fp32(uint16_t h) { return half_to_float(h); }

uint16_t fp32_to_fp16(float f) {
  const uint32_t x = float_bits(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t a = x & 0x7FFFFFFF;
  if (a > 0x7F800000) return sign | 0x7E00 | ((a >> 13) & 0x3FF);  // nan, kept quiet
  if (a >= 0x477FF000) return sign | 0x7C00;  // at or past the midpoint above 65504
  if (a >= 0x38800000) {
    // Normal half: rebias the exponent by 127 - 15 and round the 13 dropped bits to
    // nearest even; a carry out of the mantissa correctly bumps the exponent.
    uint32_t h = (a - 0x38000000) >> 13;
    const uint32_t rest = a & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (a <= 0x33000000) return sign;  // at most half the smallest subnormal: ties to zero
  // Subnormal half: count units of 2^-24, rounding to nearest even.
  const uint32_t e = a >> 23;
  const uint32_t mant = (a & 0x7FFFFF) | 0x800000;
  const uint32_t shift = 126 - e;
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_fp32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

}  // namespace kvbench
