// CUDA twin of kernels/cpu/kivi_attention.h: attention over KIVI storage (kernels/layouts.h,
// KiviKv) reading the packed codes, device pointers. Include only from CUDA-aware code: this
// header pulls in <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include "kernels/layouts.h"

namespace kvbench {

// As attention_kivi_cpu: causal-by-position GQA attention over kv's quantized blocks, then its
// fp32 tail, each block's codes dequantized in registers as it is reached (no fp32 copy of the
// cache). pages: nullptr reads every slot; otherwise (a host struct whose pages pointer is on the
// device) only the selected pages, page boundaries in global slot numbers (blocks first, then the
// tail), each head's row ascending. Enqueued on `stream` (asynchronous); split-K
// (flash-decoding) when too few (query, head) pairs fill the GPU. head_dim 64 or 128, group 32,
// bits 2 or 4. Throws std::invalid_argument for anything else, std::runtime_error on a CUDA
// error.
void attention_kivi_cuda(const AttentionQuery& query, const KiviKv& kv, const PageSelection* pages,
                         cudaStream_t stream);

}  // namespace kvbench
