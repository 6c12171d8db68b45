// A ragged retain plan (RetainPlan::head_keep) from each KV head's kept slots, for the tests
// of heads of their own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "methods/policy.h"

namespace kvbench::testing {

// kept[h]: KV head h's slots, ascending.
inline RetainPlan ragged_plan(const std::vector<std::vector<int32_t>>& kept) {
  RetainPlan plan;
  for (const auto& head : kept) {
    plan.head_keep.push_back(static_cast<int64_t>(head.size()));
    plan.slots.insert(plan.slots.end(), head.begin(), head.end());
    plan.n_keep = std::max<int64_t>(plan.n_keep, static_cast<int64_t>(head.size()));
  }
  return plan;
}

}  // namespace kvbench::testing
