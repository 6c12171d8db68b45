#include "cache/windowed_policy.h"

namespace kvbench {

bool WindowedPolicy::plan(int32_t layer, const DenseKv& kv, CachePhase phase,
                          RetainPlan& plan) {
  if (phase != CachePhase::ContextEnd || windows_.closed(layer)) return false;
  // Whatever is decided, the window's queries are not needed afterwards.
  const QueryWindow held = windows_.close(layer);
  const int64_t n = kv.n_tokens;
  const int64_t budget_limit = limits_.resolve(layer, phase, n);
  if (budget_limit < 0) return false;
  const int64_t limit = layer_limit(layer, n, budget_limit);
  if (n <= limit) return false;
  return select(layer, kv, held, limit, plan);
}

}  // namespace kvbench
