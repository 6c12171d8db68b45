#include "kernels/cpu/layer_ops.h"

#include <cmath>
#include <cstring>

namespace kvbench {

void rms_norm_cpu(const float* x, const float* weight, float* y, int64_t n_rows, int64_t dim,
                  float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float sum = 0.f;
    for (int64_t i = 0; i < dim; ++i) sum += xr[i] * xr[i];
    const float scale = 1.f / std::sqrt(sum / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void rope_interleaved_cpu(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads,
                          int32_t head_dim, const float* inv_freq) {
  const int32_t half = head_dim / 2;
  float cos_table[512];
  float sin_table[512];
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int32_t i = 0; i < half; ++i) {
      // double: the angle reaches ~1e4 rad at long contexts; float would lose ~1e-3 rad.
      const double angle = static_cast<double>(positions[t]) * inv_freq[i];
      cos_table[i] = static_cast<float>(std::cos(angle));
      sin_table[i] = static_cast<float>(std::sin(angle));
    }
    for (int32_t h = 0; h < n_heads; ++h) {
      float* row = x + (t * n_heads + h) * head_dim;
      for (int32_t i = 0; i < half; ++i) {
        const float x0 = row[2 * i];
        const float x1 = row[2 * i + 1];
        row[2 * i] = x0 * cos_table[i] - x1 * sin_table[i];
        row[2 * i + 1] = x0 * sin_table[i] + x1 * cos_table[i];
      }
    }
  }
}

void silu_mul_cpu(const float* gate, const float* up, float* out, int64_t n) {
  // Threads past one decode row's width (a batch, a prefill chunk): scalar expf stays the
  // rounding every element gets, threaded or not.
#pragma omp parallel for schedule(static) if (n >= 16384)
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

uint16_t float_to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  // A NaN's payload may sit in the low bits only: rounding would carry it into infinity.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Ties to even: add just under half an ulp of bf16, plus one when the kept lsb is odd.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

void fp32_to_bf16_cpu(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16_bits(x[i]);
}

void round_to_bf16_cpu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_bits_to_float(float_to_bf16_bits(x[i]));
}

}  // namespace kvbench
