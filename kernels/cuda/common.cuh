// What the CUDA kernel files share: CUDA errors as exceptions naming the kernel, warp
// reductions, and the merge of split-K attention partials. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/layouts.h"

namespace kvbench::cuda {

inline void check(cudaError_t err, const char* who, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(who) + ": " + what + ": " + cudaGetErrorString(err));
  }
}

// The kernels' temporaries come from cudaMallocAsync's default pool, whose release threshold
// is 0: every synchronisation (a decode step downloads its logits) hands the pool's memory
// back, and the next cudaMallocAsync maps it again, ~50 us per call measured on an H200.
// Raising the threshold once per device keeps it pooled; call before cudaMallocAsync.
inline void keep_pool_memory(const char* who) {
  constexpr int kMaxDevices = 64;
  static bool kept[kMaxDevices] = {};  // a race here only sets the attribute twice
  int device = 0;
  check(cudaGetDevice(&device), who, "cudaGetDevice");
  if (device < 0 || device >= kMaxDevices || kept[device]) return;
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, device), who, "cudaDeviceGetDefaultMemPool");
  uint64_t threshold = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), who,
        "cudaMemPoolSetAttribute");
  kept[device] = true;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Split-K partials of attention: per (query, head) row, n_splits entries of D unnormalised
// outputs, then the running max (log2 domain) and the softmax denominator. One block per
// row, one thread per element: rescales every split to the common max; a row that saw no
// key is zeros.
template <int D>
__global__ void merge_splits_kernel(AttentionQuery query, int n_splits, const float* partial) {
  const int64_t row = blockIdx.x;  // query * n_heads + head
  const int d = threadIdx.x;
  const float* p = partial + row * n_splits * (D + 2);
  // Unrolled so that several splits' loads are in flight at once (up to 256 splits).
  float mx = -INFINITY;
#pragma unroll 8
  for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, p[s * (D + 2) + D]);
  float o = 0.0f, sum = 0.0f;
  if (mx != -INFINITY) {
#pragma unroll 8
    for (int s = 0; s < n_splits; ++s) {
      const float c = exp2f(p[s * (D + 2) + D] - mx);
      o += c * p[s * (D + 2) + d];
      sum += c * p[s * (D + 2) + D + 1];
    }
  }
  query.out[row * D + d] = sum > 0.0f ? o / sum : 0.0f;
}

}  // namespace kvbench::cuda
