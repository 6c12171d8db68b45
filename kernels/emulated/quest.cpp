// Quest's page kernels (kernels/cuda/quest.h) on the host: the wrapper's checks, pointers
// checked against the live allocations, then kernels/cpu/quest.h. Synchronous.
#include "kernels/cuda/quest.h"

#include <stdexcept>
#include <string>

#include "kernels/cpu/quest.h"
#include "kernels/emulated/layouts_extent.h"

namespace kvbench {

void page_bounds_append_cuda(PageBounds& bounds, const float* k, int64_t first_slot, int64_t n_new,
                             cudaStream_t) {
  const char* who = "page_bounds_append_cuda";
  if (first_slot < 0 || n_new < 0 || bounds.page_tokens <= 0) {
    throw std::invalid_argument(
        "page_bounds_append_cuda: first_slot and n_new must be >= 0 and "
        "page_tokens > 0");
  }
  if (n_new == 0) return;
  const int64_t pt = bounds.page_tokens;
  const int64_t end_pages = (first_slot + n_new + pt - 1) / pt;
  if (end_pages > bounds.page_capacity) {
    throw std::invalid_argument("page_bounds_append_cuda: slots up to " +
                                std::to_string(first_slot + n_new) + " need " +
                                std::to_string(end_pages) + " pages, page_capacity is " +
                                std::to_string(bounds.page_capacity));
  }
  emulated::require_device_array(k, n_new * bounds.n_kv_heads * bounds.head_dim, who, "k");
  const int64_t rows = emulated::strided_rows(bounds.n_kv_heads, bounds.page_capacity, end_pages);
  emulated::require_device_array(bounds.k_min, rows * bounds.head_dim, who, "bounds.k_min");
  emulated::require_device_array(bounds.k_max, rows * bounds.head_dim, who, "bounds.k_max");
  page_bounds_append_cpu(bounds, k, first_slot, n_new);
}

void page_scores_cuda(const AttentionQuery& query, int32_t row, const PageBounds& bounds,
                      float* scores, cudaStream_t) {
  const char* who = "page_scores_cuda";
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
  // Only q is read (row `row`'s heads), not the positions nor out.
  emulated::require_device_array(query.q, int64_t{query.n_queries} * query.n_heads * bounds.head_dim,
                                 who, "query.q");
  const int64_t rows =
      emulated::strided_rows(bounds.n_kv_heads, bounds.page_capacity, bounds.n_pages);
  emulated::require_device_array(bounds.k_min, rows * bounds.head_dim, who, "bounds.k_min");
  emulated::require_device_array(bounds.k_max, rows * bounds.head_dim, who, "bounds.k_max");
  emulated::require_device_array(scores, bounds.n_kv_heads * bounds.n_pages, who, "scores");
  page_scores_cpu(query, row, bounds, scores);
}

}  // namespace kvbench
