#include "cache/plan_helpers.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/cpu/scores.h"

namespace kvbench {

LayerLimits::LayerLimits(const Budget& budget, int32_t n_layers)
    : budget_(budget), resolved_(n_layers, budget.is_ratio() ? -1 : budget.tokens) {}

int64_t LayerLimits::resolve(int32_t layer, CachePhase phase, int64_t n_tokens) {
  int64_t& limit = resolved_[layer];
  if (limit < 0 && phase == CachePhase::ContextEnd) limit = budget_.resolve(n_tokens);
  return limit;
}

std::vector<int32_t> slots_by_position(const DenseKv& kv, int32_t head, int64_t n_oldest,
                                       int64_t n_newest) {
  const int64_t n = kv.tokens(head);
  assert(n_oldest + n_newest <= n);
  const int32_t* positions = kv.positions + static_cast<int64_t>(head) * kv.capacity;
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) order[t] = static_cast<int32_t>(t);
  const auto older = [positions](int32_t a, int32_t b) { return positions[a] < positions[b]; };
  if (n_newest > 0 && n_newest < n) {
    std::nth_element(order.begin(), order.end() - n_newest, order.end(), older);
  }
  if (n_oldest > 0 && n_oldest < n - n_newest) {
    std::nth_element(order.begin(), order.begin() + n_oldest, order.end() - n_newest, older);
  }
  return order;
}

void plan_same_slots(const std::vector<int32_t>& keep, int32_t n_kv_heads, RetainPlan& plan) {
  plan.n_keep = static_cast<int64_t>(keep.size());
  plan.slots.resize(keep.size() * n_kv_heads);
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    std::copy(keep.begin(), keep.end(), plan.slots.begin() + h * keep.size());
  }
}

void plan_top_k_per_head(const float* scores, int32_t n_kv_heads, int64_t n_tokens, int64_t k,
                         RetainPlan& plan) {
  assert(0 <= k && k <= n_tokens);
  plan.n_keep = k;
  plan.slots.resize(static_cast<size_t>(n_kv_heads * k));
  top_k_indices_cpu(scores, n_kv_heads, n_tokens, k, plan.slots.data());
}

void plan_top_k_same(const float* scores, int64_t n_tokens, int64_t k, int32_t n_kv_heads,
                     RetainPlan& plan) {
  assert(0 <= k && k <= n_tokens);
  std::vector<int32_t> keep(static_cast<size_t>(k));
  top_k_indices_cpu(scores, 1, n_tokens, k, keep.data());
  plan_same_slots(keep, n_kv_heads, plan);
}

void check_retain_plan(const RetainPlan& plan, int32_t n_kv_heads, int32_t head_dim,
                       int64_t n_tokens, const std::string& store) {
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument(store + "::retain: " + what);
  };
  if (plan.n_keep < 0 || plan.n_keep > n_tokens) fail("n_keep outside [0, n_tokens]");
  if (static_cast<int64_t>(plan.slots.size()) != plan.n_keep * n_kv_heads) {
    fail("slots must hold n_keep per KV head");
  }
  const size_t merged = plan.slots.size() * head_dim;
  if (!plan.k.empty() && (plan.k.size() != merged || plan.v.size() != merged)) {
    fail("merged k and v must hold head_dim values per kept slot");
  }
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    const int32_t* keep = plan.slots.data() + static_cast<int64_t>(h) * plan.n_keep;
    for (int64_t j = 0; j < plan.n_keep; ++j) {
      if (keep[j] < 0 || keep[j] >= n_tokens || (j > 0 && keep[j] <= keep[j - 1])) {
        fail("each head's slots must be ascending and within the stored tokens");
      }
    }
  }
}

}  // namespace kvbench
