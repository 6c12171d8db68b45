// CUDA twins of attention_dense_cpu, attention_sparse_cpu, attention_pages_cpu,
// attention_ragged_cpu and attention_narrow_cpu (kernels/cpu/attention.h): same layouts, device pointers. Include only
// from CUDA-aware code: this header pulls in <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include "kernels/layouts.h"

namespace kvbench {

// Causal-by-position GQA attention of query.n_queries queries over kv's stored tokens, all
// pointers on the device; enqueued on `stream` (asynchronous). head_dim must be 64 or 128.
// Split-K (flash-decoding) when there are too few (query, head) pairs to fill the GPU.
// Throws std::invalid_argument for an unsupported head_dim, std::runtime_error on a CUDA error.
void attention_dense_cuda(const AttentionQuery& query, const DenseKv& kv, cudaStream_t stream);

// As attention_dense_cuda, each query head reading only the keys `pattern` selects (sparse
// prefill; attention_sparse_cpu's twin), the same kernel: a tile of 64 slots that no query
// head of a block reads is skipped whole (its keys neither loaded nor computed), and keys
// outside the pattern are masked. A pattern that reads every key gives attention_dense_cuda's
// output bit for bit. pattern.columns and pattern.offsets are DEVICE pointers. Returns the
// query-key pairs (count_sparse_pairs, as the CPU's), counted on the host from copies of the
// positions and the lists: it waits for `stream` to reach the call (a prefill's few KiB).
// Throws as attention_dense_cuda.
AttentionPairs attention_sparse_cuda(const AttentionQuery& query, const DenseKv& kv,
                                     const SparsePattern& pattern, cudaStream_t stream);

// As attention_dense_cuda, reading only KV head h's selected pages (Quest's gathered attention,
// as attention_pages_cpu): pages.pages is a device pointer, each head's row strictly ascending
// (a page listed twice would be attended twice); a negative page and slots past n_tokens are
// skipped. Split-K runs over the selected slots. Throws as attention_dense_cuda, and
// std::invalid_argument for page_tokens <= 0.
void attention_pages_cuda(const AttentionQuery& query, const DenseKv& kv,
                          const PageSelection& pages, cudaStream_t stream);

// As attention_dense_cuda over KV heads held apart, each with its own count (a ragged layer;
// attention_ragged_cpu's twin): `heads` is a DEVICE array of n_kv_heads one-head DenseKv
// (n_kv_heads 1, device pointers), max_tokens the largest head's n_tokens (split-K splits
// over it; a shorter head's splits past its count read nothing).
void attention_ragged_cuda(const AttentionQuery& query, const DenseKv* heads, int32_t n_kv_heads,
                           int32_t head_dim, int64_t max_tokens, cudaStream_t stream);

// As attention_dense_cuda (pages nullptr) or attention_pages_cuda (pages: a host struct whose
// pages pointer is on the device) over a narrow store, the same kernel: each key and value is
// widened to fp32 as it is loaded (the conversion fused into the reads, as
// attention_narrow_cpu converts each tile), so the store is never widened in memory. Matches
// attention_narrow_cpu within fp32's summation order. Throws as those, and
// std::invalid_argument for fp8 without its scales.
void attention_narrow_cuda(const AttentionQuery& query, const NarrowKv& kv,
                           const PageSelection* pages, cudaStream_t stream);

}  // namespace kvbench
