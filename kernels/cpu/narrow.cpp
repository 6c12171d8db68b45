#include "kernels/cpu/narrow.h"

#include <array>
#include <cmath>
#include <cstring>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/layer_ops.h"

namespace kvbench {

uint16_t float_to_half_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (u >= 0x47800000u) return sign | 0x7c00u;  // 65536 and past: infinity
  if (u < 0x38800000u) {                       // below 2^-14: fp16 subnormal steps of 2^-24
    float a;
    std::memcpy(&a, &u, sizeof a);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));  // exact scaling
  }
  // Normal: rebias the exponent, keep 10 mantissa bits, round the 13 dropped ones to even.
  // A carry out of the mantissa steps the exponent up (to infinity from 65520 on).
  uint32_t h = ((u >> 23) - 112) << 10 | (u & 0x7fffffu) >> 13;
  const uint32_t rest = u & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

uint8_t float_to_e4m3(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  // NaN, its sign dropped: encoding divides by the row's scale, and a NaN that division makes
  // (-inf / inf) is negative on x86 and positive on a GPU; the device's code must match.
  if (u > 0x7f800000u) return 0x7fu;
  float a;
  std::memcpy(&a, &u, sizeof a);
  if (a >= kE4m3Max) return sign | 0x7eu;  // saturate (infinity too)
  if (a < 0.015625f) {                     // below 2^-6: subnormal steps of 2^-9
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));  // 8 is 2^-6's code
  }
  uint32_t c = ((u >> 23) - 120) << 3 | (u & 0x7fffffu) >> 20;
  const uint32_t rest = u & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (c & 1u))) ++c;
  return sign | static_cast<uint8_t>(c < 0x7eu ? c : 0x7eu);  // 0x7f would be NaN
}

namespace {

std::array<float, 256> make_e4m3_values() {
  std::array<float, 256> values{};
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> 3) & 0xf, m = c & 7;
    float v = e == 15 && m == 7 ? std::nanf("")
              : e == 0          ? std::ldexp(static_cast<float>(m), -9)
                                : std::ldexp(1.0f + m / 8.0f, e - 7);
    values[c] = c & 0x80 ? -v : v;
  }
  return values;
}

const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> values = make_e4m3_values();
  return values;
}

}  // namespace

float e4m3_to_float(uint8_t code) { return e4m3_values()[code]; }

float e4m3_row_scale(const float* x, int32_t n) {
  float amax = 0.0f;
  for (int32_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax > 0.0f ? amax / kE4m3Max : 1.0f;
}

void encode_kv_rows(KvElement element, const float* src, int64_t src_stride, int64_t n_rows,
                    int32_t dim, void* dst, float* scale) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* x = src + r * src_stride;
    switch (element) {
      case KvElement::F16: {
        uint16_t* out = static_cast<uint16_t*>(dst) + r * dim;
        for (int32_t d = 0; d < dim; ++d) out[d] = float_to_half_bits(x[d]);
        break;
      }
      case KvElement::BF16: {
        uint16_t* out = static_cast<uint16_t*>(dst) + r * dim;
        for (int32_t d = 0; d < dim; ++d) out[d] = float_to_bf16_bits(x[d]);
        break;
      }
      case KvElement::F8E4M3: {
        uint8_t* out = static_cast<uint8_t*>(dst) + r * dim;
        const float s = e4m3_row_scale(x, dim);
        scale[r] = s;
        for (int32_t d = 0; d < dim; ++d) out[d] = float_to_e4m3(x[d] / s);
        break;
      }
    }
  }
}

void decode_kv_rows(KvElement element, const void* src, const float* scale, int64_t n_rows,
                    int32_t dim, float* dst) {
  const int64_t n = n_rows * dim;
  int64_t i = 0;
  switch (element) {
    case KvElement::F16: {
      const uint16_t* in = static_cast<const uint16_t*>(src);
#if KVBENCH_AVX2
      for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
      }
#endif
      for (; i < n; ++i) dst[i] = half_to_float(in[i]);
      break;
    }
    case KvElement::BF16: {
      const uint16_t* in = static_cast<const uint16_t*>(src);
#if KVBENCH_AVX2
      for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
        const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
      }
#endif
      for (; i < n; ++i) dst[i] = bf16_bits_to_float(in[i]);
      break;
    }
    case KvElement::F8E4M3: {
      const uint8_t* in = static_cast<const uint8_t*>(src);
      const float* values = e4m3_values().data();
      for (int64_t r = 0; r < n_rows; ++r) {
        const float s = scale[r];
        for (int32_t d = 0; d < dim; ++d) dst[r * dim + d] = values[in[r * dim + d]] * s;
      }
      break;
    }
  }
}

}  // namespace kvbench
