// The token budget of an eviction method, as written in a spec: tokens kept per layer and
// KV head (`budget=512`) or the fraction of the shared context kept (`ratio=0.25`).
#pragma once

#include <cstdint>
#include <vector>

#include "cache/registry.h"

namespace kvbench {

// The budget every method defaults to: a quarter of a 4K context, the middle of the
// 1K-8K contexts kvbench's tasks use (SCBench runs 4096 over ~100K contexts).
constexpr int64_t kDefaultBudget = 1024;

struct Budget {
  int64_t tokens = 0;  // > 0 when given as tokens
  double ratio = 0;    // in (0, 1] when given as a fraction

  // Tokens to keep for a context of n_context tokens (ratio: rounded up, at least 1).
  int64_t resolve(int64_t n_context) const;
  bool is_ratio() const { return ratio > 0; }
};

// The two ParamInfos every budgeted method takes: budget (default `default_tokens`) and ratio.
std::vector<ParamInfo> budget_params(int64_t default_tokens);
// Reads them back; `ratio` given wins over the default budget, both given is an error
// raised by check_budget.
Budget budget_from(const MethodParams& params);
void check_budget(const MethodParams& params);
// For methods that keep a window of the newest `window` tokens inside their budget (SnapKV,
// KVMerger): a token budget smaller than the window is an error.
void check_window_in_budget(const MethodParams& params);

}  // namespace kvbench
