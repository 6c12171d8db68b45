// CUDA twins of the per-token operations of a llama block (kernels/cpu/layer_ops.h), for
// the forward pass on a GPU: same formulas and precision choices, so results agree with the
// CPU to a few fp32 roundings. Every pointer is a device pointer; each call is enqueued on
// `stream` (asynchronous; nullptr: the default stream) and throws std::runtime_error on a
// CUDA launch error. Empty sizes are no-ops. Include only from CUDA-aware code: this header
// pulls in <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvbench {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for n_rows rows of dim floats.
// x, y: [n_rows, dim]; weight: [dim]. y may be x exactly (in place, as the CPU version
// allows), but must not partially overlap it. The sum of squares is reduced in a different
// order than on the CPU: equal to ~1e-6 relative, not bitwise. One block per row: throws
// std::invalid_argument past 2^31 - 1 rows.
void rms_norm_cuda(const float* x, const float* weight, float* y, int64_t n_rows, int64_t dim,
                   float eps, cudaStream_t stream);

// Rotates adjacent pairs (x[2i], x[2i+1]) of every head of x [n_tokens, n_heads, head_dim]
// in place by positions[t] * inv_freq[i] (positions [n_tokens], inv_freq [head_dim / 2]),
// the angle in double and its sine and cosine rounded to float, as on the CPU (the angle
// reaches ~1e4 rad at long contexts). An odd head_dim's last element is left as is.
void rope_interleaved_cuda(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads,
                           int32_t head_dim, const float* inv_freq, cudaStream_t stream);

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up over n floats; out may be gate or up.
void silu_mul_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// x += y over n floats (the residual add); bit-identical to the CPU's float add.
void add_in_place_cuda(float* x, const float* y, int64_t n, cudaStream_t stream);

// y[r, i] += bias[i] for y [n_rows, dim], bias [dim] (the q/k/v bias of some models).
void add_bias_rows_cuda(float* y, const float* bias, int64_t n_rows, int64_t dim,
                        cudaStream_t stream);

// y[i] = bf16 bits of x[i] over n values (the bf16 operand of a GEMM), rounded as
// float_to_bf16_bits in kernels/cpu/layer_ops.h: bit-identical to it, except that a NaN
// becomes the GPU's canonical NaN. y must not overlap x.
void fp32_to_bf16_cuda(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

// x[i] = bf16(x[i]) in place over n floats, held in fp32 (round_to_bf16_cpu's twin): an
// activation rounded where an engine would store it as bf16.
void round_to_bf16_cuda(float* x, int64_t n, cudaStream_t stream);

}  // namespace kvbench
