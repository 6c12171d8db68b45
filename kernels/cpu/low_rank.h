// A low-rank basis along head_dim and rows projected onto it (pca_kv, methods/pca_kv.h):
// x ~ mean + basis^T c, with c = basis (x - mean) the rank coefficients of a row.
#pragma once

#include <cstdint>

namespace kvbench {

// One KV head's basis: the mean row and the leading `rank` principal directions of the rows
// it was fitted on, orthonormal, largest variance first.
struct LowRankBasis {
  const float* mean;   // [dim]
  const float* basis;  // [rank, dim]
  int32_t dim;
  int32_t rank;
};

// Fits mean [dim] and basis [rank, dim] to n rows of dim floats (row r at x + r * stride):
// the eigenvectors of the rows' covariance with the largest eigenvalues (Householder and QL in
// double precision). Deterministic; with fewer independent rows than rank, the remaining
// directions complete an orthonormal basis. n may be 0 (mean 0, basis the unit vectors).
void fit_low_rank_basis(const float* x, int64_t stride, int64_t n, int32_t dim, int32_t rank,
                        float* mean, float* basis);

// c[r * rank + i] = basis_i . (x_r - mean) for n rows (row r at x + r * stride).
void project_rows(const LowRankBasis& b, const float* x, int64_t stride, int64_t n, float* c);

// x[r * stride + d] = mean_d + sum_i c[r * rank + i] * basis_i,d for n rows.
void reconstruct_rows(const LowRankBasis& b, const float* c, int64_t n, float* x,
                      int64_t stride);

// q'[r * rank + i] = basis_i . q_r: a query in coefficient space, whose dot product with a
// row's coefficients is its dot product with the reconstructed row less q . mean (the same
// for every row, so softmax over rows does not see it).
void project_queries(const LowRankBasis& b, const float* q, int64_t stride, int64_t n,
                     float* q_out);

}  // namespace kvbench
