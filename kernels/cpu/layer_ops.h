// The small per-token operations of a llama block, on raw float rows. Used by the forward
// pass for prefill and decode alike (cheaper than ATen op dispatch at decode sizes).
#pragma once

#include <cstdint>

namespace kvbench {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for each of n_rows rows of dim floats.
void rms_norm_cpu(const float* x, const float* weight, float* y, int64_t n_rows, int64_t dim,
                  float eps);

// Rotates adjacent pairs (x[2i], x[2i+1]) of every head by position * inv_freq[i]
// (GGUF llama "normal" RoPE: the converter permutes Q/K rows so adjacent pairs rotate).
// x: [n_tokens, n_heads, head_dim] in place; inv_freq: [head_dim / 2].
void rope_interleaved_cpu(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads,
                          int32_t head_dim, const float* inv_freq);

// out = silu(gate) * up, elementwise over n floats (SwiGLU).
void silu_mul_cpu(const float* gate, const float* up, float* out, int64_t n);

}  // namespace kvbench
