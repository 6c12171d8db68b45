// A sparse prefill (methods/sparse_prefill.h) for a model on a GPU: the same patterns, the
// attention on the device (attention_sparse_cuda) over a device store's view. The pattern is
// chosen on the host: A-shape and Tri-shape need only the chunk's query positions (copied
// down); MInference's estimate runs on host copies of the chunk's last `last_q` query rows and
// the layer's keys and positions (the CPU's estimate, so the same columns and diagonals), and
// its lists go up to the device. Host code (compiled by the C++ compiler); pulls in
// <cuda_runtime.h>.
#pragma once

#include "methods/sparse_prefill.h"

namespace kvbench {

class SparsePrefillOnDevice : public SparsePrefill {
 public:
  using SparsePrefill::SparsePrefill;
  // query and kv: DEVICE pointers (the store's fp32 view). Enqueued on the default stream;
  // it waits for the stream to count the pairs (attention_sparse_cuda).
  AttentionPairs attend(const AttentionQuery& query, const DenseKv& kv,
                        int64_t prompt_end) const override;
};

}  // namespace kvbench
