#include "methods/query_window.h"

#include <algorithm>

#include "kernels/cpu/scores.h"
#include "methods/plan_helpers.h"

namespace kvbench {

void QueryWindow::observe(const AttentionQuery& query, int32_t head_dim) {
  const int64_t row = static_cast<int64_t>(query.n_heads) * head_dim;
  if (q_.empty()) {
    q_.resize(static_cast<size_t>(size_ * row));
    positions_.resize(static_cast<size_t>(size_));
    n_heads_ = query.n_heads;
    scale_ = query.scale;
  }
  for (int64_t i = std::max<int64_t>(0, query.n_queries - size_); i < query.n_queries; ++i) {
    std::copy(query.q + i * row, query.q + (i + 1) * row, q_.begin() + next_ * row);
    positions_[next_] = query.q_positions[i];
    next_ = (next_ + 1) % size_;
    n_rows_ = std::min(n_rows_ + 1, size_);
  }
}

std::vector<float> QueryWindow::kv_head_scores(const DenseKv& kv) const {
  const int64_t n = kv.n_tokens;
  const int32_t n_kv = kv.n_kv_heads;
  std::vector<float> grouped(static_cast<size_t>(n_kv * n), 0.f);
  if (n_rows_ == 0) return grouped;
  std::vector<float> head_scores(static_cast<size_t>(n_heads_ * n), 0.f);
  AttentionQuery window_query{};  // scores only: no output
  window_query.q = q_.data();
  window_query.q_positions = positions_.data();
  window_query.n_queries = static_cast<int32_t>(n_rows_);
  window_query.n_heads = n_heads_;
  window_query.scale = scale_;
  attention_scores_cpu(window_query, kv, head_scores.data());
  const int32_t group = n_heads_ / n_kv;
  for (int32_t h = 0; h < n_heads_; ++h) {
    float* out = grouped.data() + (h / group) * n;
    const float* in = head_scores.data() + h * n;
    for (int64_t t = 0; t < n; ++t) out[t] += in[t] / group;
  }
  return grouped;
}

int64_t QueryWindow::bytes_resident() const { return vector_bytes(q_) + vector_bytes(positions_); }

}  // namespace kvbench
