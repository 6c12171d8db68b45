// Retain plans for the store tests: a ragged one (RetainPlan::head_keep) from each KV head's
// kept slots, and random kept slots per head.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cache/policy.h"

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

// Appends one head's n_keep random slots of n_tokens, ascending, to plan.slots.
inline void add_random_slots(RetainPlan& plan, int64_t n_tokens, int64_t n_keep,
                             std::mt19937& rng) {
  std::vector<int32_t> slots(static_cast<size_t>(n_tokens));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(static_cast<size_t>(n_keep));
  std::sort(slots.begin(), slots.end());
  plan.slots.insert(plan.slots.end(), slots.begin(), slots.end());
}

}  // namespace kvbench::testing
