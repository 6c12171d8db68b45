#include "kernels/cpu/low_rank.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace kvbench {

namespace {

// Eigen-decomposition of the symmetric matrix v [n, n], row-major: on return column j of v
// is the unit eigenvector of eigenvalue w[j]. Householder reduction to tridiagonal form,
// then the QL method with implicit shifts (EISPACK's tred2 and tql2, as JAMA writes them):
// O(n^3), a few hundred microseconds at head_dim 64.
void symmetric_eigen(std::vector<double>& v, int n, std::vector<double>& w) {
  const auto V = [&](int i, int j) -> double& { return v[static_cast<size_t>(i) * n + j]; };
  std::vector<double>& d = w;
  std::vector<double> e(n, 0.0);
  d.assign(n, 0.0);
  for (int j = 0; j < n; ++j) d[j] = V(n - 1, j);
  // tred2: Householder reduction to tridiagonal form (d diagonal, e sub-diagonal).
  for (int i = n - 1; i > 0; --i) {
    double scale = 0.0, h = 0.0;
    for (int k = 0; k < i; ++k) scale += std::fabs(d[k]);
    if (scale == 0.0) {
      e[i] = d[i - 1];
      for (int j = 0; j < i; ++j) {
        d[j] = V(i - 1, j);
        V(i, j) = 0.0;
        V(j, i) = 0.0;
      }
    } else {
      for (int k = 0; k < i; ++k) {
        d[k] /= scale;
        h += d[k] * d[k];
      }
      double f = d[i - 1];
      double g = std::sqrt(h);
      if (f > 0) g = -g;
      e[i] = scale * g;
      h -= f * g;
      d[i - 1] = f - g;
      for (int j = 0; j < i; ++j) e[j] = 0.0;
      for (int j = 0; j < i; ++j) {
        f = d[j];
        V(j, i) = f;
        g = e[j] + V(j, j) * f;
        for (int k = j + 1; k <= i - 1; ++k) {
          g += V(k, j) * d[k];
          e[k] += V(k, j) * f;
        }
        e[j] = g;
      }
      f = 0.0;
      for (int j = 0; j < i; ++j) {
        e[j] /= h;
        f += e[j] * d[j];
      }
      const double hh = f / (h + h);
      for (int j = 0; j < i; ++j) e[j] -= hh * d[j];
      for (int j = 0; j < i; ++j) {
        f = d[j];
        g = e[j];
        for (int k = j; k <= i - 1; ++k) V(k, j) -= (f * e[k] + g * d[k]);
        d[j] = V(i - 1, j);
        V(i, j) = 0.0;
      }
    }
    d[i] = h;
  }
  // Accumulate the transformations.
  for (int i = 0; i < n - 1; ++i) {
    V(n - 1, i) = V(i, i);
    V(i, i) = 1.0;
    const double h = d[i + 1];
    if (h != 0.0) {
      for (int k = 0; k <= i; ++k) d[k] = V(k, i + 1) / h;
      for (int j = 0; j <= i; ++j) {
        double g = 0.0;
        for (int k = 0; k <= i; ++k) g += V(k, i + 1) * V(k, j);
        for (int k = 0; k <= i; ++k) V(k, j) -= g * d[k];
      }
    }
    for (int k = 0; k <= i; ++k) V(k, i + 1) = 0.0;
  }
  for (int j = 0; j < n; ++j) {
    d[j] = V(n - 1, j);
    V(n - 1, j) = 0.0;
  }
  V(n - 1, n - 1) = 1.0;
  e[0] = 0.0;
  // tql2: the tridiagonal QL algorithm with implicit shifts.
  for (int i = 1; i < n; ++i) e[i - 1] = e[i];
  e[n - 1] = 0.0;
  double f = 0.0, tst1 = 0.0;
  const double eps = std::ldexp(1.0, -52);
  for (int l = 0; l < n; ++l) {
    tst1 = std::max(tst1, std::fabs(d[l]) + std::fabs(e[l]));
    int m = l;
    while (m < n - 1 && std::fabs(e[m]) > eps * tst1) ++m;
    if (m > l) {
      do {
        double g = d[l];
        double p = (d[l + 1] - g) / (2.0 * e[l]);
        double r = std::hypot(p, 1.0);
        if (p < 0) r = -r;
        d[l] = e[l] / (p + r);
        d[l + 1] = e[l] * (p + r);
        const double dl1 = d[l + 1];
        double h = g - d[l];
        for (int i = l + 2; i < n; ++i) d[i] -= h;
        f += h;
        p = d[m];
        double c = 1.0, c2 = c, c3 = c, s = 0.0, s2 = 0.0;
        const double el1 = e[l + 1];
        for (int i = m - 1; i >= l; --i) {
          c3 = c2;
          c2 = c;
          s2 = s;
          g = c * e[i];
          h = c * p;
          r = std::hypot(p, e[i]);
          e[i + 1] = s * r;
          s = e[i] / r;
          c = p / r;
          p = c * d[i] - s * g;
          d[i + 1] = h + s * (c * g + s * d[i]);
          for (int k = 0; k < n; ++k) {
            h = V(k, i + 1);
            V(k, i + 1) = s * V(k, i) + c * h;
            V(k, i) = c * V(k, i) - s * h;
          }
        }
        p = -s * s2 * c3 * el1 * e[l] / dl1;
        e[l] = s * p;
        d[l] = c * p;
      } while (std::fabs(e[l]) > eps * tst1);
    }
    d[l] += f;
    e[l] = 0.0;
  }
}

}  // namespace

void fit_low_rank_basis(const float* x, int64_t stride, int64_t n, int32_t dim, int32_t rank,
                        float* mean, float* basis) {
  std::vector<double> mu(dim, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    for (int32_t d = 0; d < dim; ++d) mu[d] += x[r * stride + d];
  }
  for (double& m : mu) m = n > 0 ? m / static_cast<double>(n) : 0.0;
  std::vector<double> cov(static_cast<size_t>(dim) * dim, 0.0), centred(dim);
  for (int64_t r = 0; r < n; ++r) {
    for (int32_t d = 0; d < dim; ++d) centred[d] = x[r * stride + d] - mu[d];
    for (int32_t i = 0; i < dim; ++i) {
      for (int32_t j = i; j < dim; ++j) cov[i * dim + j] += centred[i] * centred[j];
    }
  }
  for (int32_t i = 0; i < dim; ++i) {
    for (int32_t j = 0; j < i; ++j) cov[i * dim + j] = cov[j * dim + i];
  }
  std::vector<double>& vectors = cov;  // decomposed in place
  std::vector<double> values;
  symmetric_eigen(vectors, dim, values);
  // Largest variance first; ties (a rank above the rows' own) by index, so the result is
  // deterministic.
  std::vector<int32_t> order(dim);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return values[a] > values[b]; });
  for (int32_t d = 0; d < dim; ++d) mean[d] = static_cast<float>(mu[d]);
  for (int32_t i = 0; i < rank; ++i) {
    for (int32_t d = 0; d < dim; ++d) {
      basis[i * dim + d] = static_cast<float>(vectors[d * dim + order[i]]);
    }
  }
}

void project_rows(const LowRankBasis& b, const float* x, int64_t stride, int64_t n, float* c) {
  for (int64_t r = 0; r < n; ++r) {
    const float* row = x + r * stride;
    for (int32_t i = 0; i < b.rank; ++i) {
      const float* u = b.basis + static_cast<int64_t>(i) * b.dim;
      float dot = 0;
      for (int32_t d = 0; d < b.dim; ++d) dot += u[d] * (row[d] - b.mean[d]);
      c[r * b.rank + i] = dot;
    }
  }
}

void reconstruct_rows(const LowRankBasis& b, const float* c, int64_t n, float* x,
                      int64_t stride) {
  for (int64_t r = 0; r < n; ++r) {
    float* row = x + r * stride;
    std::copy(b.mean, b.mean + b.dim, row);
    for (int32_t i = 0; i < b.rank; ++i) {
      const float ci = c[r * b.rank + i];
      const float* u = b.basis + static_cast<int64_t>(i) * b.dim;
      for (int32_t d = 0; d < b.dim; ++d) row[d] += ci * u[d];
    }
  }
}

void project_queries(const LowRankBasis& b, const float* q, int64_t stride, int64_t n,
                     float* q_out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* row = q + r * stride;
    for (int32_t i = 0; i < b.rank; ++i) {
      const float* u = b.basis + static_cast<int64_t>(i) * b.dim;
      float dot = 0;
      for (int32_t d = 0; d < b.dim; ++d) dot += u[d] * row[d];
      q_out[r * b.rank + i] = dot;
    }
  }
}

}  // namespace kvbench
