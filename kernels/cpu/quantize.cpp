#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kvbench {

namespace {

void check(const QuantGroups& q) {
  if ((q.bits != 2 && q.bits != 4) || q.group_size <= 0 || (q.group_size * q.bits) % 8 != 0) {
    throw std::invalid_argument("QuantGroups: bits must be 2 or 4 and group_size * bits a multiple of 8");
  }
}

// The code of x in [0, levels]: (x - min) / scale rounded half to even (nearbyint), clamped
// (rounding can push the maximum a hair past the top level).
inline uint32_t code_of(float x, float min, float inv_scale, uint32_t levels) {
  const float c = std::nearbyint((x - min) * inv_scale);
  return static_cast<uint32_t>(std::clamp(c, 0.0f, static_cast<float>(levels)));
}

// min + code * scale as one fused multiply-add, as the CUDA kernel computes it: bit for bit
// the same values on both, whatever the compiler contracts. (Rounded twice, a value could
// differ by an ulp, and a group quantized again from such values, as KIVI's tail rounding
// does, could then flip a code: a whole step.)
inline float dequantized(float code, float scale, float min) { return std::fma(code, scale, min); }

}  // namespace

void quantize_groups_cpu(const float* x, int64_t group_stride, int64_t element_stride,
                         const QuantGroups& q) {
  check(q);
  const uint32_t levels = (1u << q.bits) - 1;
  const int32_t per_byte = 8 / q.bits;
  const int64_t bytes = q.group_bytes();
#pragma omp parallel for schedule(static) if (q.n_groups >= 256)
  for (int64_t g = 0; g < q.n_groups; ++g) {
    const float* src = x + g * group_stride;
    float lo = src[0], hi = src[0];
    for (int32_t i = 1; i < q.group_size; ++i) {
      const float v = src[i * element_stride];
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    const float scale = (hi - lo) / static_cast<float>(levels);
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    q.scale[g] = scale;
    q.min[g] = lo;
    uint8_t* out = q.packed + g * bytes;
    for (int64_t b = 0; b < bytes; ++b) {
      uint32_t byte = 0;
      for (int32_t k = 0; k < per_byte; ++k) {
        const int64_t i = b * per_byte + k;
        byte |= code_of(src[i * element_stride], lo, inv, levels) << (k * q.bits);
      }
      out[b] = static_cast<uint8_t>(byte);
    }
  }
}

void dequantize_groups_cpu(const QuantGroups& q, float* x, int64_t group_stride,
                           int64_t element_stride) {
  check(q);
  const int32_t per_byte = 8 / q.bits;
  const uint32_t mask = (1u << q.bits) - 1;
  const int64_t bytes = q.group_bytes();
#pragma omp parallel for schedule(static) if (q.n_groups >= 256)
  for (int64_t g = 0; g < q.n_groups; ++g) {
    float* dst = x + g * group_stride;
    const uint8_t* in = q.packed + g * bytes;
    const float scale = q.scale[g], lo = q.min[g];
    for (int64_t b = 0; b < bytes; ++b) {
      const uint32_t byte = in[b];
      for (int32_t k = 0; k < per_byte; ++k) {
        dst[(b * per_byte + k) * element_stride] =
            dequantized(static_cast<float>((byte >> (k * q.bits)) & mask), scale, lo);
      }
    }
  }
}

void quantize_groups_reference(const float* x, int64_t group_stride, int64_t element_stride,
                               const QuantGroups& q) {
  check(q);
  const double levels = std::pow(2.0, q.bits) - 1;
  for (int64_t g = 0; g < q.n_groups; ++g) {
    float lo = x[g * group_stride], hi = lo;
    for (int32_t i = 0; i < q.group_size; ++i) {
      lo = std::min(lo, x[g * group_stride + i * element_stride]);
      hi = std::max(hi, x[g * group_stride + i * element_stride]);
    }
    q.scale[g] = (hi - lo) / static_cast<float>(levels);
    q.min[g] = lo;
    std::fill(q.packed + g * q.group_bytes(), q.packed + (g + 1) * q.group_bytes(), 0);
    for (int32_t i = 0; i < q.group_size; ++i) {
      const float v = x[g * group_stride + i * element_stride];
      int code = 0;
      if (q.scale[g] > 0) {
        code = static_cast<int>(std::nearbyint((v - lo) * (1.0f / q.scale[g])));
        code = std::max(0, std::min(code, static_cast<int>(levels)));
      }
      const int64_t bit = static_cast<int64_t>(i) * q.bits;
      q.packed[g * q.group_bytes() + bit / 8] |= static_cast<uint8_t>(code << (bit % 8));
    }
  }
}

void dequantize_groups_reference(const QuantGroups& q, float* x, int64_t group_stride,
                                 int64_t element_stride) {
  check(q);
  for (int64_t g = 0; g < q.n_groups; ++g) {
    for (int32_t i = 0; i < q.group_size; ++i) {
      const int64_t bit = static_cast<int64_t>(i) * q.bits;
      const int code = (q.packed[g * q.group_bytes() + bit / 8] >> (bit % 8)) & ((1 << q.bits) - 1);
      x[g * group_stride + i * element_stride] =
          dequantized(static_cast<float>(code), q.scale[g], q.min[g]);
    }
  }
}

}  // namespace kvbench
