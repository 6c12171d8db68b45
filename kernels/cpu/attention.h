// Causal attention of a chunk of queries over one layer's dense KV, on the CPU.
// Tiled with an online softmax (FlashAttention-style), so no n_queries x n_tokens score
// matrix is ever materialised: memory is O(tile), whatever the context length (the scored
// variant keeps one work item's numerators, up to 192 rows x n_tokens floats a thread).
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/layouts.h"

namespace kvbench {

void attention_dense_cpu(const AttentionQuery& query, const DenseKv& kv);

// attention_dense_cpu (its output bit for bit) that also ADDS the softmax attention each
// stored token receives, summed over the query rows, into scores [query.n_heads, n_tokens]:
// what attention_scores_cpu adds, up to fp32 rounding (H2O's and D2O's scores). Where the
// dense kernel tiles the queries (prefill), in the same pass: each work item keeps its rows'
// softmax numerators and sums them once its rows' denominators are final. Where it splits
// the keys instead (few queries: decode), attention then attention_scores_cpu.
void attention_dense_scored_cpu(const AttentionQuery& query, const DenseKv& kv, float* scores);

// Plain two-pass softmax reference with the same layouts, for tests.
void attention_dense_reference(const AttentionQuery& query, const DenseKv& kv);

// As attention_dense_cpu, each query head reading only the keys `pattern` selects (sparse
// prefill). A pattern that reads every key gives attention_dense_cpu's output bit for bit.
// Returns the query-key pairs computed and those a dense causal attention computes.
AttentionPairs attention_sparse_cpu(const AttentionQuery& query, const DenseKv& kv,
                                    const SparsePattern& pattern);

// As attention_dense_cpu over a layer whose KV heads hold different numbers of tokens
// (head-wise budgets: RetainPlan::head_keep): heads[h] is KV head h alone (n_kv_heads 1), in
// buffers of its own with its own capacity and n_tokens. Equals attention_dense_cpu over
// the same rows with each head's absent slots masked out.
void attention_ragged_cpu(const AttentionQuery& query, const DenseKv* heads, int32_t n_kv_heads);

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

// Writes slots [start, start + n) of KV head kvh in fp32: keys and values [n, head_dim] back
// to back and their positions [n]. Called from several threads at once.
using DecodeKvRows = std::function<void(int32_t kvh, int64_t start, int32_t n, float* k, float* v,
                                        int32_t* positions)>;

// attention_dense_cpu (pages nullptr) or attention_pages_cpu over a store of n_kv_heads heads
// of n_tokens slots held in another form: each key tile (kKeyTile slots at most) is decoded
// into per-thread buffers as it is read, so the store is never widened whole. Equals those
// kernels over the decoded rows, bit for bit. The narrow and KVQuant stores read this way.
void attention_decoded_cpu(const AttentionQuery& query, int32_t n_kv_heads, int32_t head_dim,
                           int64_t n_tokens, const PageSelection* pages,
                           const DecodeKvRows& decode);

}  // namespace kvbench
