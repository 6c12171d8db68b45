// Applying a retain plan out of place: the kept slots of each KV head copied, compacted, into
// another DenseKv-layout buffer (an eviction's "gather"); or in place, moving only the rows a
// placement moves. The CPU references of gather_rows_cuda and move_rows_cuda
// (kernels/cuda/gather.h).
#pragma once

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// Where a gather writes: DenseKv's layout (kernels/layouts.h) with writable pointers; the
// head count and head_dim are the source's. Must not overlap the source.
struct GatherTarget {
  float* k;            // [n_kv_heads, capacity, head_dim]
  float* v;            // [n_kv_heads, capacity, head_dim]
  int32_t* positions;  // [n_kv_heads, capacity]
  int64_t capacity;    // row stride between heads, in tokens; >= n_keep
};

// For every KV head h and j < n_keep, copies slot s = slots[h * n_keep + j] of `kv` (its key,
// value and position) to slot j of `out`. Slots need not be ascending or distinct, but must lie
// in [0, kv.n_tokens). Returns the view of `out` holding n_keep tokens. Nothing past n_keep in
// `out` is written. Throws std::invalid_argument for n_keep < 0, out.capacity < n_keep or a
// slot out of range (checked before anything is written).
DenseKv gather_rows_cpu(const DenseKv& kv, const int32_t* slots, int64_t n_keep,
                        const GatherTarget& out);

// Moves rows within one buffer of DenseKv's layout (`rows`, n_kv_heads heads of
// rows.capacity rows): for i < n_moves, row to[i] gets row from[i] (key, value and position),
// rows numbered across heads (h * rows.capacity + slot). A decode-step eviction placed by
// place_kept_slots (cache/full_cache.h) moves a row or two this way instead of every kept
// row. No row may be both a source and a destination, nor a destination twice, since the CUDA
// twin copies every move at once: place_kept_slots with every slot settled gives such moves
// (its holes lie below n_keep, the rows that fill them at or past it). Throws
// std::invalid_argument for n_moves < 0, a row outside [0, n_kv_heads * rows.capacity), a row
// both read and written or one written twice (checked before anything is written).
void move_rows_cpu(const GatherTarget& rows, int32_t n_kv_heads, int32_t head_dim,
                   const int64_t* from, const int64_t* to, int64_t n_moves);

}  // namespace kvbench
