// gather_rows_cuda and move_rows_cuda (kernels/cuda/gather.h) on the host: the wrapper's checks,
// the pointers checked against the live allocations, then gather_rows_cpu or move_rows_cpu.
// Synchronous; the stream is ignored.
#include "kernels/cuda/gather.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/emulated/layouts_extent.h"

namespace kvbench {

DenseKv gather_rows_cuda(const DenseKv& kv, const int32_t* slots, int64_t n_keep,
                         const GatherTarget& out, cudaStream_t) {
  const char* who = "gather_rows_cuda";
  if (n_keep < 0 || out.capacity < n_keep) {
    throw std::invalid_argument("gather_rows_cuda: n_keep (" + std::to_string(n_keep) +
                                ") must be in [0, out.capacity = " +
                                std::to_string(out.capacity) + "]");
  }
  if (kv.n_kv_heads > 65535) {
    throw std::invalid_argument("gather_rows_cuda: more than 65535 KV heads");
  }
  const DenseKv view{out.k, out.v, out.positions, kv.n_kv_heads, kv.head_dim, out.capacity, n_keep};
  if (n_keep == 0 || kv.n_kv_heads <= 0 || kv.head_dim <= 0) return view;
  emulated::require_dense_kv(kv, who);
  emulated::require_device_array(slots, n_keep * kv.n_kv_heads, who, "slots");
  emulated::require_dense_kv(view, who);
  const int64_t n_slots = n_keep * kv.n_kv_heads;
  if (std::all_of(slots, slots + n_slots, [&](int32_t s) { return s >= 0 && s < kv.n_tokens; })) {
    return gather_rows_cpu(kv, slots, n_keep, out);
  }
  // The kernel leaves a row whose slot is out of range unwritten where the CPU throws: that
  // behaviour, in the smallest loop (no CPU counterpart).
  const int64_t dim = kv.head_dim;
  for (int64_t h = 0; h < kv.n_kv_heads; ++h) {
    for (int64_t j = 0; j < n_keep; ++j) {
      const int32_t s = slots[h * n_keep + j];
      if (s < 0 || s >= kv.n_tokens) continue;
      const int64_t from = h * kv.capacity + s, to = h * out.capacity + j;
      std::copy(kv.k + from * dim, kv.k + (from + 1) * dim, out.k + to * dim);
      std::copy(kv.v + from * dim, kv.v + (from + 1) * dim, out.v + to * dim);
      out.positions[to] = kv.positions[from];
    }
  }
  return view;
}

void move_rows_cuda(const GatherTarget& rows, int32_t n_kv_heads, int32_t head_dim,
                    const int64_t* from, const int64_t* to, int64_t n_moves, cudaStream_t) {
  const char* who = "move_rows_cuda";
  if (n_moves < 0) {
    throw std::invalid_argument("move_rows_cuda: n_moves (" + std::to_string(n_moves) +
                                ") must be >= 0");
  }
  if (n_moves == 0 || n_kv_heads <= 0 || head_dim <= 0) return;
  if ((n_moves + 7) / 8 > 2147483647) {  // the kernel's grid: eight moves a block
    throw std::invalid_argument("move_rows_cuda: too many moves");
  }
  const int64_t n_rows = static_cast<int64_t>(n_kv_heads) * rows.capacity;
  emulated::require_device_array(rows.k, n_rows * head_dim, who, "rows.k");
  emulated::require_device_array(rows.v, n_rows * head_dim, who, "rows.v");
  emulated::require_device_array(rows.positions, n_rows, who, "rows.positions");
  emulated::require_device_array(from, n_moves, who, "from");
  emulated::require_device_array(to, n_moves, who, "to");
  const auto in_range = [&](int64_t r) { return r >= 0 && r < n_rows; };
  if (std::all_of(from, from + n_moves, in_range) && std::all_of(to, to + n_moves, in_range)) {
    // A row both read and written, or written twice, throws here, where the kernel would race.
    move_rows_cpu(rows, n_kv_heads, head_dim, from, to, n_moves);
    return;
  }
  // The kernel skips a move with a row out of range where the CPU throws (no CPU counterpart).
  for (int64_t i = 0; i < n_moves; ++i) {
    if (!in_range(from[i]) || !in_range(to[i])) continue;
    std::copy(rows.k + from[i] * head_dim, rows.k + (from[i] + 1) * head_dim,
              rows.k + to[i] * head_dim);
    std::copy(rows.v + from[i] * head_dim, rows.v + (from[i] + 1) * head_dim,
              rows.v + to[i] * head_dim);
    rows.positions[to[i]] = rows.positions[from[i]];
  }
}

}  // namespace kvbench
