// Token scores that cache policies (methods/) plan with, over one layer's dense KV.
// None of them materialises an n_queries x n_tokens matrix: attention scores are computed for
// blocks of at most 24 query rows (rows x n_tokens scratch per thread, about one L2 at 4K
// tokens), whatever the number of queries.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/layouts.h"

namespace kvbench {

// Softmax attention each stored slot receives, summed over the query rows:
// scores[h * n_tokens + t] += sum_i softmax_t(q_i,h . k_t * scale) for query head h (causal
// by position, as attention itself). ADDS into `scores` ([query.n_heads, kv.n_tokens]) so
// H2O can accumulate across forwards; query.out is not touched. A query that sees no stored
// key adds nothing. The fp32 summation order depends on the thread count.
void attention_scores_cpu(const AttentionQuery& query, const DenseKv& kv, float* scores);

// Each query row's attention to each stored slot, per query head, row by row:
// probs[(i * query.n_heads + h) * kv.n_tokens + t] (overwritten; a row that sees no stored key
// is zeros). MInference estimates its pattern from these for a chunk's last queries.
void attention_row_scores_cpu(const AttentionQuery& query, const DenseKv& kv, float* probs);

// The attention the chunk's last query row gives each stored slot, per query head:
// [query.n_heads, kv.n_tokens] (what TOVA, SAGE-KV and LazyEviction score by; on a GPU,
// TokenPolicy::ScoredRows::Last computes the same there).
std::vector<float> last_row_scores_cpu(const AttentionQuery& query, const DenseKv& kv);

// C[rows][ncols] = A[rows][kdim] * B[kdim][ncols], fp32: the tiled attention kernels' GEMM, for
// a policy's own query-key products (KVzip's reconstruction scores keys transposed into B).
// A(r, k) = a[r * lda + k]; B's rows are ldb apart, C's ldc.
void gemm_cpu(int rows, int kdim, int ncols, const float* a, int64_t lda, const float* b,
              int64_t ldb, float* c, int64_t ldc);

// For each row i of A [rows, kdim] (row-major), the column j of B [kdim, ncols] (row-major)
// with the largest product A_i . B_j (the first of equals) and that product: best[i],
// best_dot[i]. Threaded over blocks of rows. With unit rows and columns, each row's most
// similar column by cosine (D2O's nearest kept key).
void nearest_columns_cpu(const float* a, int64_t rows, int kdim, const float* b, int64_t ncols,
                         int64_t* best, float* best_dot);

// Plain double-precision reference of attention_scores_cpu, for tests.
void attention_scores_reference(const AttentionQuery& query, const DenseKv& kv, float* scores);

// L2 norm of every stored key: norms[h * n_tokens + t] = ||k_{h,t}|| ([n_kv_heads, n_tokens]).
void key_norms_cpu(const DenseKv& kv, float* norms);

// Cosine similarity of every stored key to its head's anchor, the mean of the head's
// L2-normalised keys (KeyDiff): cosine[h * n_tokens + t] ([n_kv_heads, n_tokens]).
void key_anchor_cosine_cpu(const DenseKv& kv, float* cosine);

enum class PoolKind : int32_t { Avg, Max };

// 1-D pooling along each row, stride 1, window `kernel` (odd) centred on each element.
// Like PyTorch's pool1d with padding kernel/2: max ignores the padding, avg counts it as
// zeros (count_include_pad). in, out: [rows, n]; in == out is not allowed.
void pool1d_cpu(const float* in, float* out, int64_t rows, int64_t n, int32_t kernel,
                PoolKind kind);

// For each row, the indices of its k largest values (ties: the lower index), written in
// ascending index order: out[r * k .. r * k + k). Requires 0 <= k <= n.
void top_k_indices_cpu(const float* values, int64_t rows, int64_t n, int64_t k, int32_t* out);

}  // namespace kvbench
