// The per-token operations of a llama block (kernels/cuda/layer_ops.h) on the host: pointers
// checked against the live allocations, then kernels/cpu/layer_ops.h. Synchronous.
#include "kernels/cuda/layer_ops.h"

#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/layer_ops.h"
#include "kernels/emulated/device_memory.h"

namespace kvbench {

using emulated::require_device_array;

void rms_norm_cuda(const float* x, const float* weight, float* y, int64_t n_rows, int64_t dim,
                   float eps, cudaStream_t) {
  if (n_rows <= 0 || dim <= 0) return;
  if (n_rows > INT_MAX) {
    throw std::invalid_argument("rms_norm_cuda: " + std::to_string(n_rows) +
                                " rows exceed the grid limit");
  }
  require_device_array(x, n_rows * dim, "rms_norm_cuda", "x");
  require_device_array(weight, dim, "rms_norm_cuda", "weight");
  require_device_array(y, n_rows * dim, "rms_norm_cuda", "y");
  rms_norm_cpu(x, weight, y, n_rows, dim, eps);
}

void rope_interleaved_cuda(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads,
                           int32_t head_dim, const float* inv_freq, cudaStream_t) {
  if (n_tokens * (head_dim / 2) <= 0 || n_heads <= 0) return;
  require_device_array(x, n_tokens * n_heads * head_dim, "rope_interleaved_cuda", "x");
  require_device_array(positions, n_tokens, "rope_interleaved_cuda", "positions");
  require_device_array(inv_freq, int64_t{head_dim / 2}, "rope_interleaved_cuda", "inv_freq");
  rope_interleaved_cpu(x, positions, n_tokens, n_heads, head_dim, inv_freq);
}

void silu_mul_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t) {
  if (n <= 0) return;
  require_device_array(gate, n, "silu_mul_cuda", "gate");
  require_device_array(up, n, "silu_mul_cuda", "up");
  require_device_array(out, n, "silu_mul_cuda", "out");
  silu_mul_cpu(gate, up, out, n);
}

// No CPU counterpart (the CPU forward adds inline): the loop itself.
void add_in_place_cuda(float* x, const float* y, int64_t n, cudaStream_t) {
  if (n <= 0) return;
  require_device_array(x, n, "add_in_place_cuda", "x");
  require_device_array(y, n, "add_in_place_cuda", "y");
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// No CPU counterpart (Linear::apply adds its bias inline): the loop itself.
void add_bias_rows_cuda(float* y, const float* bias, int64_t n_rows, int64_t dim, cudaStream_t) {
  if (n_rows <= 0 || dim <= 0) return;
  require_device_array(y, n_rows * dim, "add_bias_rows_cuda", "y");
  require_device_array(bias, dim, "add_bias_rows_cuda", "bias");
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] += bias[i];
  }
}

}  // namespace kvbench

namespace kvbench {

void fp32_to_bf16_cuda(const float* x, uint16_t* y, int64_t n, cudaStream_t) {
  if (n <= 0) return;
  require_device_array(x, n, "fp32_to_bf16_cuda", "x");
  require_device_array(y, n, "fp32_to_bf16_cuda", "y");
  fp32_to_bf16_cpu(x, y, n);
}

void round_to_bf16_cuda(float* x, int64_t n, cudaStream_t) {
  if (n <= 0) return;
  require_device_array(x, n, "round_to_bf16_cuda", "x");
  round_to_bf16_cpu(x, n);
}

}  // namespace kvbench
