// adjacent_key_cosine_cuda (kernels/cuda/merge.h) on the host: pointers checked against the
// live allocations, then adjacent_key_cosine_cpu. Synchronous.
#include "kernels/cuda/merge.h"

#include "kernels/cpu/merge.h"
#include "kernels/emulated/layouts_extent.h"

namespace kvbench {

void adjacent_key_cosine_cuda(const DenseKv& kv, const int32_t* order, float* sim, cudaStream_t) {
  const char* who = "adjacent_key_cosine_cuda";
  if (kv.n_tokens <= 0 || kv.n_kv_heads <= 0) return;
  emulated::require_dense_kv(kv, who);
  emulated::require_device_array(order, kv.n_kv_heads * kv.n_tokens, who, "order");
  emulated::require_device_array(sim, kv.n_kv_heads * kv.n_tokens, who, "sim");
  adjacent_key_cosine_cpu(kv, order, sim);
}

}  // namespace kvbench
