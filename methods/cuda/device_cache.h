// Which device store each storage method runs on with the model on a GPU, and the cache of a
// sequence built from them: the one place that names the methods' device twins.
// Host code; pulls in <cuda_runtime.h>.
#pragma once

#include "cache/kv_cache.h"
#include "cache/registry.h"

namespace kvbench {

// The cache of one sequence for `spec` with the model on a GPU: device stores (dense, KIVI's
// packed blocks, or fp16/bf16/fp8 rows), the spec's policy or read policy wrapped as above, and
// its sparse prefill on the device (methods/cuda/sparse_prefill.h).
// Throws InputError naming the method for components that cannot run there yet (reuse, tiers).
KvCache make_cuda_cache(const ResolvedSpec& spec, const KvShape& shape);

}  // namespace kvbench
