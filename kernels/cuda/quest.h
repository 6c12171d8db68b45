// CUDA twin of kernels/cpu/quest.h: Quest's page key bounds and page scores over PageBounds
// (kernels/layouts.h), device pointers. Include only from CUDA-aware code: this header pulls in
// <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// As page_bounds_append_cpu: folds n_new keys k ([n_new, n_kv_heads, head_dim], device),
// stored at slots [first_slot, first_slot + n_new), into the bounds of their pages; a page's
// first key sets its bounds. bounds.n_pages (a host field) grows to cover the last slot at
// once; the device update is enqueued on `stream`. Bit-identical to the CPU (min and max only).
// Throws std::invalid_argument for a negative first_slot or n_new, page_tokens <= 0 or pages
// past page_capacity, std::runtime_error on a CUDA error.
void page_bounds_append_cuda(PageBounds& bounds, const float* k, int64_t first_slot, int64_t n_new,
                             cudaStream_t stream);

// As page_scores_cpu: scores[h * n_pages + p] = max over KV head h's query heads g of
// sum_d max(q_gd * k_min_pd, q_gd * k_max_pd) for query row `row`. scores: [n_kv_heads,
// bounds.n_pages] on the device. Any head_dim. Throws std::invalid_argument for a row out of
// range or n_heads not a multiple of n_kv_heads, std::runtime_error on a CUDA error.
void page_scores_cuda(const AttentionQuery& query, int32_t row, const PageBounds& bounds,
                      float* scores, cudaStream_t stream);

}  // namespace kvbench
