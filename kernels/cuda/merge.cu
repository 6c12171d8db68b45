#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/merge.h"

namespace kvbench {
namespace {

using cuda::warp_sum;

constexpr int kWarps = 4;  // adjacent pairs per block, a warp each

void check(cudaError_t err, const char* what) {
  cuda::check(err, "adjacent_key_cosine_cuda", what);
}

// Block (pairs kWarps x .. + kWarps, KV head y); a warp per pair, lanes over channels. Each
// key's norm is computed twice (once per pair it is in): cheaper than a second pass here.
__global__ void __launch_bounds__(kWarps * 32)
    adjacent_cosine_kernel(DenseKv kv, const int32_t* order, float* sim) {
  const int h = blockIdx.y;
  const int64_t n = kv.n_tokens;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= n) return;
  float* out = sim + h * n;
  if (i == n - 1) {  // the last key has no next
    if (lane == 0) out[i] = 0.0f;
    return;
  }
  const int dim = kv.head_dim;
  const float* k_head = kv.k + h * kv.capacity * dim;
  const float* a = k_head + static_cast<int64_t>(order[h * n + i]) * dim;
  const float* b = k_head + static_cast<int64_t>(order[h * n + i + 1]) * dim;
  float ab = 0.0f, aa = 0.0f, bb = 0.0f;
  for (int d = lane; d < dim; d += 32) {
    ab = fmaf(a[d], b[d], ab);
    aa = fmaf(a[d], a[d], aa);
    bb = fmaf(b[d], b[d], bb);
  }
  ab = warp_sum(ab);
  aa = warp_sum(aa);
  bb = warp_sum(bb);
  const float denom = sqrtf(aa) * sqrtf(bb);
  if (lane == 0) out[i] = denom > 0.0f ? ab / denom : 0.0f;  // a zero key is similar to nothing
}

}  // namespace

void adjacent_key_cosine_cuda(const DenseKv& kv, const int32_t* order, float* sim,
                              cudaStream_t stream) {
  if (kv.n_tokens <= 0 || kv.n_kv_heads <= 0) return;
  const dim3 grid(static_cast<unsigned>((kv.n_tokens + kWarps - 1) / kWarps),
                  static_cast<unsigned>(kv.n_kv_heads));
  adjacent_cosine_kernel<<<grid, kWarps * 32, 0, stream>>>(kv, order, sim);
  check(cudaGetLastError(), "kernel launch");
}

}  // namespace kvbench
