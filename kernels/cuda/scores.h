// CUDA twins of kernels/cpu/scores.h: the token scores cache policies plan with (H2O, TOVA,
// SnapKV, KeyDiff, Knorm, Quest's page pick), over the same layouts (kernels/layouts.h) with
// device pointers, enqueued on a stream. Include only from CUDA-aware code: this header pulls in
// <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/scores.h"  // PoolKind
#include "kernels/layouts.h"

namespace kvbench {

// As attention_scores_cpu: ADDS into scores[h * n_tokens + t] ([query.n_heads, kv.n_tokens],
// device) the softmax attention query head h's rows give stored slot t, summed over the query
// rows (causal by position; a query that sees no stored key adds nothing). query.out is not
// touched. Two passes, never an n_queries x n_tokens matrix: each row's max and softmax
// denominator ([n_queries, n_heads] stats, a temporary from cudaMallocAsync), then each slot's
// probabilities recomputed and summed over the rows. fp32 with a fixed summation order
// (deterministic run to run); not bit-identical to the CPU. head_dim must be 64 or 128.
// Throws std::invalid_argument for another head_dim, n_heads not a multiple of n_kv_heads or
// over 65535 heads, std::runtime_error on a CUDA error.
void attention_scores_cuda(const AttentionQuery& query, const DenseKv& kv, float* scores,
                           cudaStream_t stream);

// As key_norms_cpu: norms[h * n_tokens + t] = ||k_{h,t}|| ([n_kv_heads, n_tokens], device).
// Any head_dim. Throws std::runtime_error on a CUDA error.
void key_norms_cuda(const DenseKv& kv, float* norms, cudaStream_t stream);

// As key_anchor_cosine_cpu (KeyDiff): cosine[h * n_tokens + t] ([n_kv_heads, n_tokens], device)
// of each key to its head's anchor, the mean of the head's L2-normalised keys (summed in double,
// as the CPU; a zero key adds nothing and has cosine 0, as every key of a zero anchor). Any
// head_dim. Uses a temporary from cudaMallocAsync. Throws std::runtime_error on a CUDA error.
void key_anchor_cosine_cuda(const DenseKv& kv, float* cosine, cudaStream_t stream);

// As pool1d_cpu, bit-identical: stride-1 pooling of each row with an odd window `kernel` centred
// on each element; max ignores the padding (and compares as std::max_element), avg sums the
// window left to right and counts the padding as zeros. in, out: [rows, n] on the device, not
// overlapping. Throws std::invalid_argument for an even or non-positive kernel or in == out,
// std::runtime_error on a CUDA error.
void pool1d_cuda(const float* in, float* out, int64_t rows, int64_t n, int32_t kernel,
                 PoolKind kind, cudaStream_t stream);

// As top_k_indices_cpu, identical indices: for each row of values ([rows, n], device), the
// indices of its k largest values (ties to the lower index, -0 equal to +0, NaN below every
// number), ascending: out[r * k .. r * k + k) (device). One block per row: a radix select of
// the k-th largest, then an ordered compaction. Throws std::invalid_argument unless
// 0 <= k <= n < 2^31 and rows < 2^31, std::runtime_error on a CUDA error.
void top_k_indices_cuda(const float* values, int64_t rows, int64_t n, int64_t k, int32_t* out,
                        cudaStream_t stream);

}  // namespace kvbench
