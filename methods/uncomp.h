// UNComp's uncertainty measure and how it splits a budget (methods/uncomp.cpp): the truncated
// matrix entropy of a KV head's keys, and budgets by entropy groups. Declared here for the
// tests (tests/test_uncomp.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace kvbench {

// -sum of l log l over the top_k largest eigenvalues l of gram / trace(gram) (natural log;
// top_k <= 0: all of them). gram: [dim, dim], symmetric positive semi-definite. The identity
// gives log(dim), a rank-1 matrix 0; a zero matrix gives 0.
double spectral_entropy(std::vector<double> gram, int32_t dim, int32_t top_k);

// The authors' matrix entropy of n_tokens keys (rows of head_dim floats, `stride` floats
// apart): the keys centred over the tokens, each row scaled to unit length (zero rows left
// out), Z^T Z / n, then spectral_entropy. Keys along one direction give 0, isotropic keys
// about log(head_dim) (at most log(top_k) when truncated).
double key_entropy(const float* keys, int64_t n_tokens, int64_t stride, int32_t head_dim,
                   int32_t top_k);

// Splits `total` tokens over units (layers, or one layer's KV heads) by their entropy: ranked
// by entropy, lowest first, into `groups` groups of sizes differing by at most one (rank r
// of n in group r * groups / n); group g of G weighs 1 - spread + 2 spread g / (G - 1), so
// the lowest-entropy group is compressed hardest. Counts are proportional to the weights,
// at most `cap` each (the excess goes to the others in proportion), rounded by largest remainder:
// they sum to min(total, cap * units).
std::vector<int64_t> entropy_counts(const std::vector<double>& entropy, int64_t total,
                                    int64_t cap, int32_t groups, double spread);

}  // namespace kvbench
