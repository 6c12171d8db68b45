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

// bf16 as the model's bf16 mode holds weights and activations (harness/model/cuda_forward.h):
// the upper 16 bits of an fp32, here as uint16_t bits so that host code needs no CUDA type.
// fp32 -> bf16 rounds to nearest, ties to even (as __float2bfloat16_rn and checkpoint
// converters do): finite values past bf16's largest round to infinity, subnormals are kept.
// A NaN stays a NaN (quiet, its sign kept) instead of rounding into infinity; which NaN is
// not part of the contract (the GPU's cvt gives its canonical one).
uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(uint16_t bits);  // exact
void fp32_to_bf16_cpu(const float* x, uint16_t* y, int64_t n);
// x[i] = bf16(x[i]) in place, held in fp32: the value a bf16 store of x[i] would read back.
void round_to_bf16_cpu(float* x, int64_t n);

}  // namespace kvbench
