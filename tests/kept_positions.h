// The tokens a cache layer's KV head holds, for tests of what a method keeps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cache/full_cache.h"
#include "cache/kv_cache.h"

namespace kvbench::testing {

// Original positions held by KV head `head` of `layer`, ascending (retain may reorder
// slots, so slot order says nothing).
inline std::vector<int32_t> kept(const KvCache& cache, int32_t layer, int32_t head) {
  // A dense store shows each head alone, also once its heads hold their own counts.
  if (const auto* dense = dynamic_cast<const DenseLayerKv*>(&cache.layer(layer))) {
    const DenseKv kv = dense->head_view(head);
    std::vector<int32_t> positions(kv.positions, kv.positions + kv.n_tokens);
    std::sort(positions.begin(), positions.end());
    return positions;
  }
  const DenseKv kv = cache.layer(layer).view();
  std::vector<int32_t> positions(kv.positions + head * kv.capacity,
                                 kv.positions + head * kv.capacity + kv.n_tokens);
  std::sort(positions.begin(), positions.end());
  return positions;
}

}  // namespace kvbench::testing
