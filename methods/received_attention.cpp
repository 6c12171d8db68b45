#include "methods/received_attention.h"

#include <algorithm>

#include "kernels/cpu/scores.h"

namespace kvbench {

void ReceivedAttention::observe(const AttentionQuery& query, const DenseKv& kv) {
  start(query.n_heads);
  grow(kv.n_tokens);
  attention_scores_cpu(query, kv, values_.data());
}

void ReceivedAttention::add(const float* scores, int32_t n_heads, int64_t n_tokens) {
  start(n_heads);
  grow(n_tokens);
  const int64_t n = static_cast<int64_t>(n_heads) * n_tokens;
  for (int64_t i = 0; i < n; ++i) values_[i] += scores[i];
}

void ReceivedAttention::grow(int64_t n) {
  if (n <= n_tokens_) return;
  const int64_t old = n_tokens_;
  values_.resize(static_cast<size_t>(n_heads_ * n));
  for (int64_t r = n_heads_ - 1; r >= 0; --r) {
    std::copy_backward(values_.begin() + r * old, values_.begin() + (r + 1) * old,
                       values_.begin() + r * n + old);
    std::fill(values_.begin() + r * n + old, values_.begin() + (r + 1) * n, 0.f);
  }
  n_tokens_ = n;
}

void ReceivedAttention::retained(const RetainPlan& plan, int32_t n_kv_heads) {
  retain_rows(values_, n_heads_, n_tokens_, plan, n_kv_heads);
  n_tokens_ = plan.n_keep;
}

std::vector<float> ReceivedAttention::per_kv_head(int32_t n_kv_heads) const {
  const int64_t n = n_tokens_;
  std::vector<float> out(static_cast<size_t>(n_kv_heads * n), 0.f);
  const int32_t group = std::max(1, n_heads_ / n_kv_heads);
  for (int32_t h = 0; h < n_heads_; ++h) {
    float* to = out.data() + (h / group) * n;
    const float* from = values_.data() + h * n;
    for (int64_t t = 0; t < n; ++t) to[t] += from[t];
  }
  return out;
}

}  // namespace kvbench
