// gather_rows_cuda (kernels/cuda/gather.h) on the host: the wrapper's checks, the pointers
// checked against the live allocations, then gather_rows_cpu. Synchronous; the stream is ignored.
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

}  // namespace kvbench
