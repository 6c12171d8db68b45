#include "cache/ragged_view.h"

#include <algorithm>
#include <stdexcept>

namespace kvbench {

DenseKv RaggedView::gather(const std::vector<DenseKv>& heads) {
  const auto n_heads = static_cast<int32_t>(heads.size());
  if (n_heads == 0) throw std::invalid_argument("RaggedView::gather: no heads");
  const int32_t d = heads[0].head_dim;
  int64_t most = 0;
  for (const DenseKv& head : heads) most = std::max(most, head.n_tokens);
  k_.assign(static_cast<size_t>(n_heads * most * d), 0.f);
  v_.assign(k_.size(), 0.f);
  positions_.assign(static_cast<size_t>(n_heads * most), kPaddingPosition);
  counts_.resize(static_cast<size_t>(n_heads));
  for (int32_t h = 0; h < n_heads; ++h) {
    const DenseKv& head = heads[h];
    if (head.n_kv_heads != 1 || head.head_dim != d) {
      throw std::invalid_argument("RaggedView::gather: a head's view is not one head wide");
    }
    counts_[h] = head.n_tokens;
    // A one-head view's rows are contiguous (its stride between heads never applies).
    std::copy_n(head.k, head.n_tokens * d, k_.begin() + h * most * d);
    std::copy_n(head.v, head.n_tokens * d, v_.begin() + h * most * d);
    std::copy_n(head.positions, head.n_tokens, positions_.begin() + h * most);
  }
  DenseKv view{k_.data(), v_.data(), positions_.data(), n_heads, d, most, most};
  view.head_tokens = counts_.data();
  return view;
}

void RaggedView::clear() {
  k_ = {};
  v_ = {};
  positions_ = {};
  counts_ = {};
}

}  // namespace kvbench
