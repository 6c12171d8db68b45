// CUDA twin of kernels/cpu/gather.h: applies a retain plan on the device, copying each KV head's
// kept slots, compacted, from one DenseKv (kernels/layouts.h) into another. Include only from
// CUDA-aware code: this header pulls in <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/gather.h"
#include "kernels/layouts.h"

namespace kvbench {

// As gather_rows_cpu: slot j of KV head h in `out` gets slot slots[h * n_keep + j] of `kv` (key,
// value, position). kv's and out's pointers and slots ([n_kv_heads, n_keep]) are on the device;
// `out` must not overlap `kv`. Enqueued on `stream` (asynchronous); bit-identical to the CPU (a
// copy). Returns the view of `out` holding n_keep tokens. The slots are not read back: a slot
// outside [0, kv.n_tokens) leaves its output row unwritten instead of reading out of bounds
// (the CPU throws). Throws std::invalid_argument for n_keep < 0 or out.capacity < n_keep,
// std::runtime_error on a CUDA error.
DenseKv gather_rows_cuda(const DenseKv& kv, const int32_t* slots, int64_t n_keep,
                         const GatherTarget& out, cudaStream_t stream);

}  // namespace kvbench
