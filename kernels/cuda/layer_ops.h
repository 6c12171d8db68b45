// CUDA twins of the per-token operations of a llama block (kernels/cpu/layer_ops.h), for
// the forward pass on a GPU. Every pointer is a device pointer; each call is enqueued on
// `stream` (asynchronous) and throws std::runtime_error on a CUDA launch error. Include
// only from CUDA-aware code: this header pulls in <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvbench {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for n_rows rows of dim floats; y may be x.
void rms_norm_cuda(const float* x, const float* weight, float* y, int64_t n_rows, int64_t dim,
                   float eps, cudaStream_t stream);

// Rotates adjacent pairs of every head of x [n_tokens, n_heads, head_dim] in place by
// positions[t] * inv_freq[i] (positions [n_tokens], inv_freq [head_dim / 2]), the angle in
// double as on the CPU (it reaches ~1e4 rad at long contexts).
void rope_interleaved_cuda(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads,
                           int32_t head_dim, const float* inv_freq, cudaStream_t stream);

// out = silu(gate) * up over n floats; out may be gate or up.
void silu_mul_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// x += y over n floats.
void add_in_place_cuda(float* x, const float* y, int64_t n, cudaStream_t stream);

// y[r, i] += bias[i] for n_rows rows of dim floats.
void add_bias_rows_cuda(float* y, const float* bias, int64_t n_rows, int64_t dim,
                        cudaStream_t stream);

}  // namespace kvbench
