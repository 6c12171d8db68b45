#include "kernels/cpu/merge.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/avx2.h"

namespace kvbench {
namespace {

constexpr int64_t kPairsPerItem = 512;        // adjacent pairs per OpenMP work item
constexpr int64_t kParallelFloats = 1 << 16;  // fewer key floats than this: one thread

// a . b and b . b in one pass over the two keys.
void dot_and_norm2(const float* a, const float* b, int n, float& ab, float& bb) {
  int d = 0;
  ab = 0.0f;
  bb = 0.0f;
#if KVBENCH_AVX2
  __m256 vab = _mm256_setzero_ps(), vbb = _mm256_setzero_ps();
  for (; d + 8 <= n; d += 8) {
    const __m256 va = _mm256_loadu_ps(a + d), vb = _mm256_loadu_ps(b + d);
    vab = _mm256_fmadd_ps(va, vb, vab);
    vbb = _mm256_fmadd_ps(vb, vb, vbb);
  }
  ab = hsum(vab);
  bb = hsum(vbb);
#endif
  for (; d < n; ++d) {
    ab += a[d] * b[d];
    bb += b[d] * b[d];
  }
}

}  // namespace

void adjacent_key_cosine_cpu(const DenseKv& kv, const int32_t* order, float* sim) {
  const int dim = kv.head_dim;
  const int64_t n = kv.n_tokens;
  if (n == 0) return;
  const int64_t chunks = (n + kPairsPerItem - 1) / kPairsPerItem;
  const int64_t n_items = kv.n_kv_heads * chunks;
  const bool parallel = !omp_in_parallel() && kv.n_kv_heads * n * dim >= kParallelFloats;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t item = 0; item < n_items; ++item) {
    const int h = static_cast<int>(item / chunks);
    const int64_t i0 = item % chunks * kPairsPerItem;
    const int64_t i1 = std::min(n - 1, i0 + kPairsPerItem);
    const float* k_head = kv.k + h * kv.capacity * dim;
    const int32_t* ord = order + h * n;
    float* out = sim + h * n;
    // Each key's norm is computed once, as the second of its pair, and carried to the next.
    const float* prev = k_head + static_cast<int64_t>(ord[i0]) * dim;
    float prev_norm2, unused;
    dot_and_norm2(prev, prev, dim, unused, prev_norm2);
    for (int64_t i = i0; i < i1; ++i) {
      const float* next = k_head + static_cast<int64_t>(ord[i + 1]) * dim;
      float dot, next_norm2;
      dot_and_norm2(prev, next, dim, dot, next_norm2);
      const float denom = std::sqrt(prev_norm2) * std::sqrt(next_norm2);
      out[i] = denom > 0.0f ? dot / denom : 0.0f;  // a zero key is similar to nothing
      prev = next;
      prev_norm2 = next_norm2;
    }
    if (item % chunks == chunks - 1) out[n - 1] = 0.0f;  // the last key has no next
  }
}

void adjacent_key_cosine_reference(const DenseKv& kv, const int32_t* order, float* sim) {
  const int dim = kv.head_dim;
  const int64_t n = kv.n_tokens;
  for (int h = 0; h < kv.n_kv_heads; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      double value = 0.0;
      if (i + 1 < n) {
        const float* a = kv.k + (h * kv.capacity + order[h * n + i]) * dim;
        const float* b = kv.k + (h * kv.capacity + order[h * n + i + 1]) * dim;
        double ab = 0.0, aa = 0.0, bb = 0.0;
        for (int d = 0; d < dim; ++d) {
          ab += static_cast<double>(a[d]) * b[d];
          aa += static_cast<double>(a[d]) * a[d];
          bb += static_cast<double>(b[d]) * b[d];
        }
        if (aa > 0.0 && bb > 0.0) value = ab / std::sqrt(aa * bb);
      }
      sim[h * n + i] = static_cast<float>(value);
    }
  }
}

}  // namespace kvbench
