// Quest's page kernels on the CPU (kernels/layouts.h, PageBounds): the per-page key
// minimum and maximum kept as tokens are stored, and each page's upper bound on a query's
// attention logit, which picks the pages decode attention reads.
#pragma once

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// Folds n_new new keys, stored at slots [first_slot, first_slot + n_new), into the bounds
// of the pages they fall in. k: [n_new, n_kv_heads, head_dim] (the projection layout). A
// page's first key sets its bounds. bounds.n_pages grows to cover the last slot; the
// caller sizes page_capacity.
void page_bounds_append_cpu(PageBounds& bounds, const float* k, int64_t first_slot,
                            int64_t n_new);

// Upper bound of the attention logit query row `row` can give any key of each page:
// scores[h * n_pages + p] = max over KV head h's query heads g of
// sum_d max(q_gd * k_min_pd, q_gd * k_max_pd). scores: [n_kv_heads, bounds.n_pages].
void page_scores_cpu(const AttentionQuery& query, int32_t row, const PageBounds& bounds,
                     float* scores);
void page_scores_reference(const AttentionQuery& query, int32_t row, const PageBounds& bounds,
                           float* scores);

}  // namespace kvbench
