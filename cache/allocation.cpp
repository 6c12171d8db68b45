#include "cache/allocation.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>

#include "kernels/cpu/scores.h"

namespace kvbench {

void plan_top_k_ragged(const float* scores, int32_t n_kv_heads, int64_t n_tokens,
                       const std::vector<int64_t>& counts, RetainPlan& plan) {
  assert(static_cast<int32_t>(counts.size()) == n_kv_heads);
  plan.head_keep = counts;
  plan.n_keep = *std::max_element(counts.begin(), counts.end());
  plan.slots.resize(static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0})));
  plan.k.clear();
  plan.v.clear();
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    assert(0 <= counts[h] && counts[h] <= n_tokens);
    top_k_indices_cpu(scores + h * n_tokens, 1, n_tokens, counts[h],
                      plan.slots.data() + plan.head_offset(h));
  }
}

std::vector<int64_t> round_counts(const std::vector<double>& targets) {
  const size_t n = targets.size();
  std::vector<int64_t> counts(n);
  double total = 0;
  int64_t given = 0;
  for (size_t i = 0; i < n; ++i) {
    counts[i] = static_cast<int64_t>(std::floor(targets[i]));
    given += counts[i];
    total += targets[i];
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return targets[a] - std::floor(targets[a]) > targets[b] - std::floor(targets[b]);
  });
  // 1e-9: sums of fractions that are whole in exact arithmetic are not lost to rounding.
  for (int64_t extra = static_cast<int64_t>(std::floor(total + 1e-9)) - given, i = 0; i < extra;
       ++i) {
    ++counts[order[i]];
  }
  return counts;
}

}  // namespace kvbench
