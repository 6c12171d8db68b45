#include "kernels/cpu/quest.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <limits>

#include "kernels/cpu/avx2.h"

namespace kvbench {
namespace {

constexpr int kMaxGroupPass = 4;              // query heads scored per pass over a page's bounds
constexpr int64_t kPagesPerItem = 64;         // pages per OpenMP work item
constexpr int64_t kParallelFloats = 1 << 16;  // fewer bound floats than this: one thread

// Upper bound of G query heads' logits over one page: for each head g, sum over d of
// max(q_gd * min_d, q_gd * max_d), i.e. q_gd times the bound its sign picks.
template <int G>
void page_bounds_dot(const float* q, int dim, const float* k_min, const float* k_max, float* out) {
  int d = 0;
  float acc[G] = {};
#if KVBENCH_AVX2
  __m256 vacc[G];
  KVBENCH_UNROLL
  for (int g = 0; g < G; ++g) vacc[g] = _mm256_setzero_ps();
  for (; d + 8 <= dim; d += 8) {
    const __m256 lo = _mm256_loadu_ps(k_min + d);
    const __m256 hi = _mm256_loadu_ps(k_max + d);
    KVBENCH_UNROLL
    for (int g = 0; g < G; ++g) {
      const __m256 qv = _mm256_loadu_ps(q + g * dim + d);
      // The sign bit of q picks k_min, else k_max: the larger of the two products.
      vacc[g] = _mm256_fmadd_ps(qv, _mm256_blendv_ps(hi, lo, qv), vacc[g]);
    }
  }
  KVBENCH_UNROLL
  for (int g = 0; g < G; ++g) acc[g] = hsum(vacc[g]);
#endif
  for (; d < dim; ++d) {
    KVBENCH_UNROLL
    for (int g = 0; g < G; ++g) {
      const float qd = q[g * dim + d];
      acc[g] += std::max(qd * k_min[d], qd * k_max[d]);
    }
  }
  KVBENCH_UNROLL
  for (int g = 0; g < G; ++g) out[g] = acc[g];
}

using BoundsDot = void (*)(const float*, int, const float*, const float*, float*);
constexpr BoundsDot kBoundsDot[kMaxGroupPass + 1] = {
    nullptr, page_bounds_dot<1>, page_bounds_dot<2>, page_bounds_dot<3>, page_bounds_dot<4>};

}  // namespace

void page_bounds_append_cpu(PageBounds& bounds, const float* k, int64_t first_slot, int64_t n_new) {
  assert(first_slot >= 0 && n_new >= 0 && bounds.page_tokens > 0);
  if (n_new == 0) return;
  const int dim = bounds.head_dim;
  const int64_t pt = bounds.page_tokens;
  assert((first_slot + n_new + pt - 1) / pt <= bounds.page_capacity);
  for (int h = 0; h < bounds.n_kv_heads; ++h) {
    for (int64_t j = 0; j < n_new; ++j) {
      const int64_t slot = first_slot + j;
      const int64_t row = h * bounds.page_capacity + slot / pt;
      const float* key = k + (j * bounds.n_kv_heads + h) * dim;
      float* lo = bounds.k_min + row * dim;
      float* hi = bounds.k_max + row * dim;
      if (slot % pt == 0) {  // a page's first key sets its bounds
        std::copy(key, key + dim, lo);
        std::copy(key, key + dim, hi);
        continue;
      }
      for (int d = 0; d < dim; ++d) {
        lo[d] = std::min(lo[d], key[d]);
        hi[d] = std::max(hi[d], key[d]);
      }
    }
  }
  bounds.n_pages = std::max(bounds.n_pages, (first_slot + n_new + pt - 1) / pt);
}

void page_scores_cpu(const AttentionQuery& query, int32_t row, const PageBounds& bounds,
                     float* scores) {
  assert(query.n_heads % bounds.n_kv_heads == 0 && 0 <= row && row < query.n_queries);
  const int dim = bounds.head_dim;
  const int group = query.n_heads / bounds.n_kv_heads;
  const int64_t n_pages = bounds.n_pages;
  const float* q_row = query.q + static_cast<int64_t>(row) * query.n_heads * dim;
  const int64_t chunks = (n_pages + kPagesPerItem - 1) / kPagesPerItem;
  const int64_t n_items = bounds.n_kv_heads * chunks;
  // Bounds are streamed once: a second thread pays only when there are many of them.
  const bool parallel =
      !omp_in_parallel() && 2 * bounds.n_kv_heads * n_pages * dim >= kParallelFloats;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t item = 0; item < n_items; ++item) {
    const int h = static_cast<int>(item / chunks);
    const int64_t p0 = item % chunks * kPagesPerItem;
    const int64_t p1 = std::min(n_pages, p0 + kPagesPerItem);
    const float* q_head = q_row + static_cast<int64_t>(h) * group * dim;
    float* out = scores + h * n_pages;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t at = (h * bounds.page_capacity + p) * dim;
      float best = -std::numeric_limits<float>::infinity();
      for (int g0 = 0; g0 < group; g0 += kMaxGroupPass) {
        const int g_n = std::min(kMaxGroupPass, group - g0);
        float part[kMaxGroupPass];
        kBoundsDot[g_n](q_head + g0 * dim, dim, bounds.k_min + at, bounds.k_max + at, part);
        for (int g = 0; g < g_n; ++g) best = std::max(best, part[g]);
      }
      out[p] = best;
    }
  }
}

void page_scores_reference(const AttentionQuery& query, int32_t row, const PageBounds& bounds,
                           float* scores) {
  const int dim = bounds.head_dim;
  const int group = query.n_heads / bounds.n_kv_heads;
  const float* q_row = query.q + static_cast<int64_t>(row) * query.n_heads * dim;
  for (int h = 0; h < bounds.n_kv_heads; ++h) {
    for (int64_t p = 0; p < bounds.n_pages; ++p) {
      const float* lo = bounds.k_min + (h * bounds.page_capacity + p) * dim;
      const float* hi = bounds.k_max + (h * bounds.page_capacity + p) * dim;
      double best = -std::numeric_limits<double>::infinity();
      for (int g = 0; g < group; ++g) {
        const float* q = q_row + static_cast<int64_t>(h * group + g) * dim;
        double sum = 0.0;
        for (int d = 0; d < dim; ++d) {
          sum += std::max(static_cast<double>(q[d]) * lo[d], static_cast<double>(q[d]) * hi[d]);
        }
        best = std::max(best, sum);
      }
      scores[h * bounds.n_pages + p] = static_cast<float>(best);
    }
  }
}

}  // namespace kvbench
