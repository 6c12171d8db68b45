// Key similarity for merging methods (KVMerger) on the CPU.
#pragma once

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// Cosine similarity of each stored key to the next one in position order, per KV head:
// sim[h * n_tokens + i] = cos(k_{h, order[h * n_tokens + i]}, k_{h, order[h * n_tokens + i + 1]})
// for i < n_tokens - 1; sim[h * n_tokens + n_tokens - 1] = 0. order: [n_kv_heads, n_tokens]
// each head's slots ascending by position. A zero key has similarity 0 to anything.
void adjacent_key_cosine_cpu(const DenseKv& kv, const int32_t* order, float* sim);
void adjacent_key_cosine_reference(const DenseKv& kv, const int32_t* order, float* sim);

}  // namespace kvbench
