// CUDA twin of kernels/cpu/merge.h: key similarity for merging methods (KVMerger) over DenseKv
// (kernels/layouts.h), device pointers. Include only from CUDA-aware code: this header pulls in
// <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// As adjacent_key_cosine_cpu: sim[h * n_tokens + i] = cos(k_{h, order[h * n_tokens + i]},
// k_{h, order[h * n_tokens + i + 1]}) for i < n_tokens - 1, and 0 for the last; a zero key has
// similarity 0. order: [n_kv_heads, n_tokens], sim: [n_kv_heads, n_tokens], on the device. Any
// head_dim. Enqueued on `stream`. Throws std::runtime_error on a CUDA error.
void adjacent_key_cosine_cuda(const DenseKv& kv, const int32_t* order, float* sim,
                              cudaStream_t stream);

}  // namespace kvbench
