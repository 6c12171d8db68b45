// The report's kept-token heat maps: for one sample, the tokens each layer and KV head of
// each method's cache kept after the first turn, over the tokens the cache had seen then
// (UnitRecord::head_tokens). Uniform methods show uniform rows; head-wise budgets (AdaKV)
// differ along a row, layer budgets (PyramidKV) down the columns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "store/results_db.h"

namespace kvbench {

struct HeadMap {
  std::string method;  // canonical spec
  std::string task;
  std::string sample_id;
  std::string mode;
  int64_t tokens_seen = 0;
  std::vector<std::vector<int64_t>> kept;  // [layer][kv head]
  std::string family;  // UnitRecord::parts.family
};

// The maps of one sample, one per method spec: the task that sorts first among the units
// that recorded head tokens (the leaderboard's first task column), the first of its samples
// written, in that unit's mode. The full cache first, then by spec. Empty when no unit
// recorded head tokens (a db written before schema v5).
std::vector<HeadMap> first_sample_head_maps(const std::vector<UnitRecord>& units);

// The fill for a kept fraction, clamped to [0, 1]: white (nothing kept) to dark blue (all),
// darker as the fraction grows. "#rrggbb".
std::string kept_fraction_colour(double fraction);

// One map as a small self-contained SVG: a title line (method, task, sample), layers as rows
// (layer 0 on top), KV heads as columns, one <rect class="cell"> per (layer, head) in
// row-major order, each with its count in a tooltip, and a colour legend from 0 to 1.
std::string head_map_svg(const HeadMap& map);

}  // namespace kvbench
