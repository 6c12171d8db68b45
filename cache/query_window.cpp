#include "cache/query_window.h"

#include <algorithm>

#include "cache/plan_helpers.h"
#include "kernels/cpu/scores.h"

namespace kvbench {

// The ring grows to hold the rows it has seen, up to `size`: a window larger than any
// context (window=10^17) costs only the context's rows, never size x row up front.
void QueryWindow::observe(const AttentionQuery& query, int32_t head_dim) {
  const int64_t row = static_cast<int64_t>(query.n_heads) * head_dim;
  if (n_rows_ == 0) {
    n_heads_ = query.n_heads;
    scale_ = query.scale;
  }
  const int64_t first = std::max<int64_t>(0, query.n_queries - size_);
  const int64_t held = std::min(size_, n_rows_ + (query.n_queries - first));
  q_.reserve(static_cast<size_t>(held * row));
  positions_.reserve(static_cast<size_t>(held));
  for (int64_t i = first; i < query.n_queries; ++i) {
    const float* q = query.q + i * row;
    if (n_rows_ < size_) {  // filling: rows in arrival order, the oldest at next_ = 0
      q_.insert(q_.end(), q, q + row);
      positions_.push_back(query.q_positions[i]);
      ++n_rows_;
    } else {
      std::copy(q, q + row, q_.begin() + next_ * row);
      positions_[next_] = query.q_positions[i];
      next_ = (next_ + 1) % size_;
    }
  }
}

AttentionQuery QueryWindow::query() const {
  AttentionQuery window_query{};
  window_query.q = q_.data();
  window_query.q_positions = positions_.data();
  window_query.n_queries = static_cast<int32_t>(n_rows_);
  window_query.n_heads = n_heads_;
  window_query.scale = scale_;
  return window_query;
}

std::vector<float> QueryWindow::head_scores(const DenseKv& kv) const {
  if (n_rows_ == 0) return {};
  std::vector<float> scores(static_cast<size_t>(n_heads_ * kv.n_tokens), 0.f);
  attention_scores_cpu(query(), kv, scores.data());
  return scores;
}

std::vector<float> QueryWindow::row_scores(const DenseKv& kv) const {
  if (n_rows_ == 0) return {};
  const int64_t per_row = static_cast<int64_t>(n_heads_) * kv.n_tokens;
  const int64_t row = static_cast<int64_t>(n_heads_) * kv.head_dim;
  std::vector<float> scores(static_cast<size_t>(n_rows_ * per_row), 0.f);
  for (int64_t i = 0; i < n_rows_; ++i) {
    AttentionQuery one{};  // one row at a time: its softmax alone, not the rows' sum
    one.q = q_.data() + i * row;
    one.q_positions = positions_.data() + i;
    one.n_queries = 1;
    one.n_heads = n_heads_;
    one.scale = scale_;
    attention_scores_cpu(one, kv, scores.data() + i * per_row);
  }
  return scores;
}

std::vector<float> QueryWindow::kv_head_scores(const DenseKv& kv) const {
  const int64_t n = kv.n_tokens;
  const int32_t n_kv = kv.n_kv_heads;
  std::vector<float> grouped(static_cast<size_t>(n_kv * n), 0.f);
  if (n_rows_ == 0) return grouped;
  const std::vector<float> head_scores = this->head_scores(kv);
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
