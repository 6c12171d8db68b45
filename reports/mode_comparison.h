// SCBench's headline in kvbench's terms: each method (at its budget) beside itself in every
// way a sweep drove it (multi-turn and multi-request, the query outside or inside the
// compressed span), with accuracy by turn. Methods whose memory is sub-linear in the context
// hold up in multi-request use and fall in multi-turn use; those that keep O(n) memory stay
// level. The leaderboard's "Multi-turn vs multi-request" section.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "reports/aggregate.h"
#include "reports/intervals.h"

namespace kvbench {

struct ModeCell {
  std::optional<Interval> accuracy;  // pooled over the tasks' scored turns
  std::vector<Interval> by_turn;     // turn i (the i-th scored turn of each unit) at [i-1]
};

struct ModeComparisonRow {
  std::string method, budget;
  bool full = false;  // the full cache's row
  std::vector<ModeCell> cells;  // one per ModeComparison::modes, in that order
};

struct ModeComparison {
  // Mode labels (mode_label), multi-turn ones first, then by name; empty when the
  // aggregates do not hold both a multi-turn and a multi-request mode.
  std::vector<std::string> modes;
  std::vector<ModeComparisonRow> rows;  // the full cache first, then by method and budget
};

ModeComparison compare_modes(const std::vector<Aggregate>& aggregates);

}  // namespace kvbench
