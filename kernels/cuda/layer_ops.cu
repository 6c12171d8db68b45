#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layer_ops.h"

namespace kvbench {
namespace {

constexpr int kThreads = 256;  // a multiple of 32: rms_norm reduces per warp
constexpr int64_t kMaxBlocks = 1 << 20;  // grid-stride loops cover the rest

void check_launch(const char* who) { cuda::check(cudaGetLastError(), who, "kernel launch"); }

unsigned blocks_for(int64_t items) {
  return static_cast<unsigned>(std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxBlocks));
}

__device__ __forceinline__ int64_t first_item() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t item_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// One block per row: the sum of squares reduced over the block (warps, then the warps'
// partials), then the row scaled. Each thread writes only elements it read after the
// reduction finished, so y == x is safe.
__global__ void rms_norm_kernel(const float* x, const float* weight, float* y, int64_t dim,
                                float eps) {
  __shared__ float partial[kThreads / 32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += xr[i] * xr[i];
  sum = cuda::warp_sum(sum);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x < 32) {
    sum = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.f;
    sum = cuda::warp_sum(sum);
    if (threadIdx.x == 0) partial[0] = sum;
  }
  __syncthreads();
  // 1 / sqrt (both IEEE-rounded without fast math) as on the CPU, not the approximate rsqrtf.
  const float scale = 1.f / sqrtf(partial[0] / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * scale * weight[i];
}

// A thread per (token, pair): the angle's sine and cosine once, then every head of the token
// rotated by them (consecutive threads touch consecutive pairs of a head: coalesced).
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads,
                            int32_t head_dim, const float* inv_freq) {
  const int32_t half = head_dim / 2;
  const int64_t items = n_tokens * half;
  for (int64_t item = first_item(); item < items; item += item_stride()) {
    const int64_t t = item / half;
    const int32_t i = static_cast<int32_t>(item % half);
    // double, as the CPU: in float an angle of ~1e4 rad would be off by ~1e-3 rad.
    double s, c;
    sincos(static_cast<double>(positions[t]) * inv_freq[i], &s, &c);
    const float sin_a = static_cast<float>(s), cos_a = static_cast<float>(c);
    for (int32_t h = 0; h < n_heads; ++h) {
      float* pair = x + (t * n_heads + h) * head_dim + 2 * i;
      const float x0 = pair[0], x1 = pair[1];
      pair[0] = x0 * cos_a - x1 * sin_a;
      pair[1] = x0 * sin_a + x1 * cos_a;
    }
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = first_item(); i < n; i += item_stride()) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  for (int64_t i = first_item(); i < n; i += item_stride()) x[i] += y[i];
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t n, int64_t dim) {
  for (int64_t i = first_item(); i < n; i += item_stride()) y[i] += bias[i % dim];
}

// __float2bfloat16_rn: round to nearest even (cvt.rn.bf16.f32 on sm_80+), NaN kept as NaN.
__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = first_item(); i < n; i += item_stride()) {
    y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}

__global__ void round_bf16_kernel(float* x, int64_t n) {
  for (int64_t i = first_item(); i < n; i += item_stride()) {
    x[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
  }
}

}  // namespace

void rms_norm_cuda(const float* x, const float* weight, float* y, int64_t n_rows, int64_t dim,
                   float eps, cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  if (n_rows > INT_MAX) {  // one block per row: the grid's x limit
    throw std::invalid_argument("rms_norm_cuda: " + std::to_string(n_rows) +
                                " rows exceed the grid limit");
  }
  rms_norm_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(x, weight, y, dim, eps);
  check_launch("rms_norm_cuda");
}

void rope_interleaved_cuda(float* x, const int32_t* positions, int64_t n_tokens, int32_t n_heads,
                           int32_t head_dim, const float* inv_freq, cudaStream_t stream) {
  const int64_t items = n_tokens * (head_dim / 2);
  if (items <= 0 || n_heads <= 0) return;
  rope_kernel<<<blocks_for(items), kThreads, 0, stream>>>(x, positions, n_tokens, n_heads,
                                                          head_dim, inv_freq);
  check_launch("rope_interleaved_cuda");
}

void silu_mul_cuda(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, out, n);
  check_launch("silu_mul_cuda");
}

void add_in_place_cuda(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  check_launch("add_in_place_cuda");
}

void add_bias_rows_cuda(float* y, const float* bias, int64_t n_rows, int64_t dim,
                        cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  add_bias_kernel<<<blocks_for(n_rows * dim), kThreads, 0, stream>>>(y, bias, n_rows * dim, dim);
  check_launch("add_bias_rows_cuda");
}

void fp32_to_bf16_cuda(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, y, n);
  check_launch("fp32_to_bf16_cuda");
}

void round_to_bf16_cuda(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  round_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n);
  check_launch("round_to_bf16_cuda");
}

}  // namespace kvbench
