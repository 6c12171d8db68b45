#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quest.h"

namespace kvbench {
namespace {

using cuda::warp_sum;

constexpr int kBoundsThreads = 128;  // threads over head_dim per (page, KV head)
constexpr int kWarps = 4;            // pages scored per block, a warp each

void check(cudaError_t err, const char* what) { cuda::check(err, "quest cuda", what); }

// Block (page first_page + x, KV head y); a thread per channel. The keys of the page's new slots
// are folded in slot order with std::min / std::max's comparisons, as the CPU does.
__global__ void bounds_append_kernel(PageBounds bounds, const float* k, int64_t first_slot,
                                     int64_t n_new, int64_t first_page) {
  const int h = blockIdx.y;
  const int64_t pt = bounds.page_tokens;
  const int64_t page = first_page + blockIdx.x;
  const int64_t a = max(first_slot, page * pt);
  const int64_t b = min(first_slot + n_new, (page + 1) * pt);
  const int dim = bounds.head_dim;
  float* lo_row = bounds.k_min + (h * bounds.page_capacity + page) * dim;
  float* hi_row = bounds.k_max + (h * bounds.page_capacity + page) * dim;
  const bool fresh = a == page * pt;  // the page's first key is among the new ones
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    int64_t s = a;
    float lo, hi;
    if (fresh) {
      lo = hi = k[((s - first_slot) * bounds.n_kv_heads + h) * dim + d];
      ++s;
    } else {
      lo = lo_row[d];
      hi = hi_row[d];
    }
    for (; s < b; ++s) {
      const float key = k[((s - first_slot) * bounds.n_kv_heads + h) * dim + d];
      lo = key < lo ? key : lo;
      hi = hi < key ? key : hi;
    }
    lo_row[d] = lo;
    hi_row[d] = hi;
  }
}

// Block (pages kWarps x .. + kWarps, KV head y); a warp per page, lanes over channels.
__global__ void __launch_bounds__(kWarps * 32)
    page_scores_kernel(AttentionQuery query, int32_t row, PageBounds bounds, int group,
                       float* scores) {
  const int h = blockIdx.y;
  const int64_t page = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (page >= bounds.n_pages) return;
  const int dim = bounds.head_dim;
  const float* lo = bounds.k_min + (h * bounds.page_capacity + page) * dim;
  const float* hi = bounds.k_max + (h * bounds.page_capacity + page) * dim;
  const float* q_head =
      query.q + (static_cast<int64_t>(row) * query.n_heads + static_cast<int64_t>(h) * group) * dim;
  float best = -INFINITY;
  for (int g = 0; g < group; ++g) {
    const float* q = q_head + static_cast<int64_t>(g) * dim;
    float sum = 0.0f;
    for (int d = lane; d < dim; d += 32) sum += fmaxf(q[d] * lo[d], q[d] * hi[d]);
    best = fmaxf(best, warp_sum(sum));
  }
  if (lane == 0) scores[h * bounds.n_pages + page] = best;
}

}  // namespace

void page_bounds_append_cuda(PageBounds& bounds, const float* k, int64_t first_slot, int64_t n_new,
                             cudaStream_t stream) {
  if (first_slot < 0 || n_new < 0 || bounds.page_tokens <= 0) {
    throw std::invalid_argument(
        "page_bounds_append_cuda: first_slot and n_new must be >= 0 and "
        "page_tokens > 0");
  }
  if (n_new == 0) return;
  const int64_t pt = bounds.page_tokens;
  const int64_t first_page = first_slot / pt;
  const int64_t end_pages = (first_slot + n_new + pt - 1) / pt;
  if (end_pages > bounds.page_capacity) {
    throw std::invalid_argument("page_bounds_append_cuda: slots up to " +
                                std::to_string(first_slot + n_new) + " need " +
                                std::to_string(end_pages) + " pages, page_capacity is " +
                                std::to_string(bounds.page_capacity));
  }
  const dim3 grid(static_cast<unsigned>(end_pages - first_page),
                  static_cast<unsigned>(bounds.n_kv_heads));
  const int threads = std::min(kBoundsThreads, (bounds.head_dim + 31) / 32 * 32);
  bounds_append_kernel<<<grid, threads, 0, stream>>>(bounds, k, first_slot, n_new, first_page);
  check(cudaGetLastError(), "bounds append kernel launch");
  bounds.n_pages = std::max(bounds.n_pages, end_pages);
}

void page_scores_cuda(const AttentionQuery& query, int32_t row, const PageBounds& bounds,
                      float* scores, cudaStream_t stream) {
  if (bounds.n_kv_heads <= 0 || query.n_heads % bounds.n_kv_heads != 0) {
    throw std::invalid_argument("page_scores_cuda: n_heads (" + std::to_string(query.n_heads) +
                                ") must be a multiple of n_kv_heads (" +
                                std::to_string(bounds.n_kv_heads) + ")");
  }
  if (row < 0 || row >= query.n_queries) {
    throw std::invalid_argument("page_scores_cuda: row " + std::to_string(row) + " outside [0, " +
                                std::to_string(query.n_queries) + ")");
  }
  if (bounds.n_pages <= 0) return;
  const dim3 grid(static_cast<unsigned>((bounds.n_pages + kWarps - 1) / kWarps),
                  static_cast<unsigned>(bounds.n_kv_heads));
  page_scores_kernel<<<grid, kWarps * 32, 0, stream>>>(query, row, bounds,
                                                       query.n_heads / bounds.n_kv_heads, scores);
  check(cudaGetLastError(), "page scores kernel launch");
}

}  // namespace kvbench
