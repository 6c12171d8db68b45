// LaCache's compaction step (methods/lacache.cpp), exposed for its tests.
#pragma once

#include <cstdint>
#include <vector>

namespace kvbench {

// One compaction of a layer over budget: which of its n tokens (in position order) it
// keeps, and where the laddered region ends among them afterwards.
struct LacacheStep {
  std::vector<int64_t> keep;  // ascending indices into the layer's tokens by position
  int64_t cursor = 0;
};

// Layer `layer` of n_layers holding n > cache_size tokens, the first `start` of them sinks
// and [start, cursor) laddered already. Requires 1 <= start <= cursor, a ladder that can
// drop tokens (P_b > P_a for span, overlap) and room for one: cache_size - start - n_layers
// >= P_a.
LacacheStep lacache_step(int64_t n, int64_t cache_size, int64_t start, int64_t cursor,
                         int32_t layer, int32_t n_layers, int64_t span, int64_t overlap);

}  // namespace kvbench
