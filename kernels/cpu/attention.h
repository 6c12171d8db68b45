// Causal attention of a chunk of queries over one layer's dense KV, on the CPU.
// Tiled with an online softmax (FlashAttention-style), so no n_queries x n_tokens score
// matrix is ever materialised: memory is O(tile), whatever the context length.
#pragma once

#include "kernels/layouts.h"

namespace kvbench {

void attention_dense_cpu(const AttentionQuery& query, const DenseKv& kv);

// Plain two-pass softmax reference with the same layouts, for tests.
void attention_dense_reference(const AttentionQuery& query, const DenseKv& kv);

// As attention_dense_cpu, reading only the selected pages of each KV head (Quest's
// gathered attention): slots outside them are neither read nor attended.
void attention_pages_cpu(const AttentionQuery& query, const DenseKv& kv,
                         const PageSelection& pages);
void attention_pages_reference(const AttentionQuery& query, const DenseKv& kv,
                               const PageSelection& pages);

// attention_dense_cpu (pages nullptr) or attention_pages_cpu over a narrow store: each key
// tile is converted to fp32 as it is read, so the store is never widened whole. Equals
// those kernels over the store's decoded values (decode_kv_rows), bit for bit.
void attention_narrow_cpu(const AttentionQuery& query, const NarrowKv& kv,
                          const PageSelection* pages);

}  // namespace kvbench
