// pca_kv (methods/pca_kv.*, kernels/cpu/low_rank.*): the fitted basis, attention in
// coefficient space equal to attention over the rebuilt rows, exact at full rank and on
// keys that lie in a subspace, and bytes as the coefficients and bases.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/low_rank.h"
#include "methods/pca_kv.h"
#include "tests/attention_problem.h"
#include "tests/cache_feed.h"

using namespace kvbench;

namespace {

// A context whose keys and values are mean + a combination of `dims` fixed directions
// per KV head: a basis of that rank holds them exactly.
testing::Chunk subspace_chunk(int64_t n, const KvShape& shape, int32_t n_heads, int32_t dims,
                              std::mt19937& rng) {
  testing::Chunk c = testing::random_chunk(n, shape, n_heads, rng);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int32_t d = shape.head_dim;
  std::vector<float> dirs(shape.n_kv_heads * 2 * dims * d), mean(shape.n_kv_heads * 2 * d);
  for (float& x : dirs) x = dist(rng);
  for (float& x : mean) x = dist(rng);
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      for (int32_t kv = 0; kv < 2; ++kv) {
        float* row = (kv == 0 ? c.k : c.v).data() + (t * shape.n_kv_heads + h) * d;
        for (int32_t e = 0; e < d; ++e) row[e] = mean[(h * 2 + kv) * d + e];
        for (int32_t i = 0; i < dims; ++i) {
          const float a = dist(rng);
          const float* u = &dirs[((h * 2 + kv) * dims + i) * d];
          for (int32_t e = 0; e < d; ++e) row[e] += a * u[e];
        }
      }
    }
  }
  return c;
}

double max_error(const std::vector<float>& a, const std::vector<float>& b) {
  return testing::max_abs_diff(a, b);
}

}  // namespace

TEST_CASE("the low-rank basis is orthonormal and ordered by variance", "[unit]") {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int32_t dim = 16, n = 400;
  // Variance 16, 4, 1 along three axes, tiny elsewhere.
  std::vector<float> x(n * dim);
  for (int64_t r = 0; r < n; ++r) {
    for (int32_t d = 0; d < dim; ++d) x[r * dim + d] = 3.0f + 0.01f * dist(rng);
    x[r * dim + 5] += 4 * dist(rng);
    x[r * dim + 2] += 2 * dist(rng);
    x[r * dim + 9] += dist(rng);
  }
  std::vector<float> mean(dim), basis(3 * dim);
  fit_low_rank_basis(x.data(), dim, n, dim, 3, mean.data(), basis.data());
  for (int32_t i = 0; i < 3; ++i) {
    for (int32_t j = 0; j < 3; ++j) {
      double dot = 0;
      for (int32_t d = 0; d < dim; ++d) dot += basis[i * dim + d] * basis[j * dim + d];
      CHECK(dot == Approx(i == j ? 1.0 : 0.0).margin(1e-5));
    }
  }
  CHECK(std::fabs(basis[0 * dim + 5]) > 0.99);
  CHECK(std::fabs(basis[1 * dim + 2]) > 0.99);
  CHECK(std::fabs(basis[2 * dim + 9]) > 0.99);
  CHECK(mean[0] == Approx(3.0).margin(0.01));

  // Correlated rows in 64 dimensions: every direction an eigenvector of the covariance
  // (C u = lambda u), orthonormal, variances descending.
  const int32_t wide = 64, m = 300;
  std::vector<float> y(m * wide), mix(wide * wide);
  for (float& a : mix) a = dist(rng);
  for (int64_t r = 0; r < m; ++r) {
    std::vector<float> z(wide);
    for (int32_t i = 0; i < wide; ++i) z[i] = dist(rng) * (1.0f + i % 7);
    for (int32_t d = 0; d < wide; ++d) {
      float acc = 0;
      for (int32_t i = 0; i < wide; ++i) acc += mix[d * wide + i] * z[i];
      y[r * wide + d] = acc;
    }
  }
  std::vector<float> ymean(wide), ybasis(wide * wide);
  fit_low_rank_basis(y.data(), wide, m, wide, wide, ymean.data(), ybasis.data());
  std::vector<double> cov(wide * wide, 0.0);
  for (int64_t r = 0; r < m; ++r) {
    for (int32_t i = 0; i < wide; ++i) {
      for (int32_t j = 0; j < wide; ++j) {
        cov[i * wide + j] += (y[r * wide + i] - ymean[i]) * (y[r * wide + j] - ymean[j]);
      }
    }
  }
  double previous = INFINITY, largest = 0, worst = 0, worst_dot = 0;
  for (int32_t a = 0; a < wide; ++a) {
    const float* u = &ybasis[a * wide];
    std::vector<double> cu(wide, 0.0);
    for (int32_t i = 0; i < wide; ++i) {
      for (int32_t j = 0; j < wide; ++j) cu[i] += cov[i * wide + j] * u[j];
    }
    double lambda = 0;
    for (int32_t i = 0; i < wide; ++i) lambda += u[i] * cu[i];
    for (int32_t i = 0; i < wide; ++i) worst = std::max(worst, std::fabs(cu[i] - lambda * u[i]));
    CHECK(lambda <= previous * (1 + 1e-6));
    previous = lambda;
    largest = std::max(largest, lambda);
    for (int32_t b = 0; b < wide; ++b) {
      double dot = 0;
      for (int32_t i = 0; i < wide; ++i) dot += u[i] * ybasis[b * wide + i];
      worst_dot = std::max(worst_dot, std::fabs(dot - (a == b ? 1.0 : 0.0)));
    }
  }
  CHECK(worst_dot < 1e-5);
  CHECK(worst < 1e-6 * largest);  // fp32 directions: about 4e-8 here
}

TEST_CASE("pca_kv at full rank, or on keys in a subspace, attends as the full cache", "[unit]") {
  const KvShape shape{2, 2, 32};
  const int32_t n_heads = 6;
  for (const int32_t rank : {32, 8}) {
    INFO("rank " << rank);
    std::mt19937 rng(4);
    const testing::Chunk context = rank == 32 ? testing::random_chunk(300, shape, n_heads, rng)
                                              : subspace_chunk(300, shape, n_heads, 8, rng);
    KvCache full = make_full_cache(shape);
    KvCache pca = make_cache("pca_kv:rank=" + std::to_string(rank), shape);
    for (KvCache* c : {&full, &pca}) {
      testing::feed(*c, n_heads, context);
      c->end_context();
    }
    REQUIRE(dynamic_cast<const PcaLayerKv&>(pca.layer(0)).fitted());
    for (int step = 0; step < 3; ++step) {
      // Later tokens drawn as the context's (in the subspace: projected exactly).
      const testing::Chunk next = rank == 32 ? testing::random_chunk(1, shape, n_heads, rng)
                                             : subspace_chunk(1, shape, n_heads, 8, rng);
      const std::vector<float> want = testing::decode_step(full, n_heads, next);
      const std::vector<float> got = testing::decode_step(pca, n_heads, next);
      // Not in the subspace of the context's own directions: the next tokens' mean and
      // directions differ. Full rank holds anything.
      if (rank == 32) CHECK(max_error(got, want) < 2e-4);
    }
    // The rebuilt rows are the context's within fp32 rounding.
    const DenseKv a = full.layer(1).view(), b = pca.layer(1).view();
    REQUIRE(a.n_tokens == b.n_tokens);
    double worst = 0;
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      for (int64_t t = 0; t < 300; ++t) {
        CHECK(a.positions[h * a.capacity + t] == b.positions[h * b.capacity + t]);
        for (int32_t d = 0; d < shape.head_dim; ++d) {
          worst = std::max<double>(worst, std::fabs(a.k[(h * a.capacity + t) * 32 + d] -
                                                    b.k[(h * b.capacity + t) * 32 + d]));
          worst = std::max<double>(worst, std::fabs(a.v[(h * a.capacity + t) * 32 + d] -
                                                    b.v[(h * b.capacity + t) * 32 + d]));
        }
      }
    }
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("pca_kv's attention equals attention over its rebuilt rows", "[unit]") {
  const KvShape shape{1, 3, 64};
  const int32_t n_heads = 9;
  std::mt19937 rng(6);
  const testing::Chunk context = testing::random_chunk(500, shape, n_heads, rng);
  KvCache pca = make_cache("pca_kv:rank=12", shape);
  testing::feed(pca, n_heads, context);
  pca.end_context();
  const testing::Chunk chunk = testing::random_chunk(7, shape, n_heads, rng);
  const std::vector<float> got = testing::feed(pca, n_heads, chunk);
  // The same queries over the rebuilt rows, the new ones included (view after the feed).
  const DenseKv rebuilt = pca.layer(0).view();
  std::vector<float> want(got.size());
  std::vector<int32_t> positions(7);
  for (int i = 0; i < 7; ++i) positions[i] = 500 + i;
  attention_dense_reference(AttentionQuery{chunk.q.data(), positions.data(), want.data(), 7,
                                           n_heads, 1.f / 8.f},
                            rebuilt);
  CHECK(max_error(got, want) < 1e-4);
  // Rank 12 of 64 on random rows loses most of each row: far from the full cache.
  KvCache full = make_full_cache(shape);
  testing::feed(full, n_heads, context);
  full.end_context();
  CHECK(max_error(testing::feed(full, n_heads, chunk), got) > 0.05);
}

TEST_CASE("pca_kv holds rank coefficients per row plus its bases", "[unit]") {
  const KvShape shape{2, 2, 64};
  std::mt19937 rng(7);
  const testing::Chunk context = testing::random_chunk(1000, shape, 4, rng);
  KvCache pca = make_cache("pca_kv:rank=16", shape);
  KvCache full = make_full_cache(shape);
  for (KvCache* c : {&pca, &full}) {
    c->reserve(1000);
    testing::feed(*c, 4, context);
    c->end_context();
  }
  const int64_t rows = 1000 * shape.n_kv_heads * shape.n_layers;
  const int64_t bases = shape.n_layers * shape.n_kv_heads * 2 * (16 * 64 + 64) * 4;
  CHECK(pca.stats().bytes_resident == rows * (2 * 16 * 4 + 4) + bases);
  CHECK(full.stats().bytes_resident == rows * (2 * 64 * 4 + 4));
  // A decode step reads the coefficients.
  testing::decode_step(pca, 4, testing::random_chunk(1, shape, 4, rng));
  CHECK(pca.stats().bytes_read_last_forward ==
        (rows + shape.n_kv_heads * shape.n_layers) * (2 * 16 * 4 + 4));
  CHECK_THROWS_WITH(make_cache("pca_kv:rank=128", shape), Catch::Contains("exceeds head_dim 64"));
}

TEST_CASE("snapkv+pca_kv projects what snapkv kept; a clone is independent", "[unit]") {
  const KvShape shape{2, 2, 32};
  const int32_t n_heads = 4;
  std::mt19937 rng(9);
  const testing::Chunk context = testing::random_chunk(400, shape, n_heads, rng);
  KvCache alone = make_cache("snapkv:budget=100", shape);
  KvCache pca = make_cache("snapkv:budget=100+pca_kv:rank=32", shape);
  for (KvCache* c : {&alone, &pca}) {
    testing::feed(*c, n_heads, context);
    c->end_context();
  }
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    const DenseKv a = alone.layer(l).view(), b = pca.layer(l).view();
    REQUIRE(b.n_tokens == 100);
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      for (int64_t t = 0; t < 100; ++t) {
        REQUIRE(a.positions[h * a.capacity + t] == b.positions[h * b.capacity + t]);
      }
    }
  }
  KvCache twin = make_cache("snapkv:budget=100+pca_kv:rank=32", shape);
  testing::feed(twin, n_heads, context);
  twin.end_context();
  KvCache branch = pca.clone();
  for (int i = 0; i < 3; ++i) testing::decode_step(branch, n_heads, testing::random_chunk(1, shape, n_heads, rng));
  const testing::Chunk next = testing::random_chunk(1, shape, n_heads, rng);
  REQUIRE(testing::decode_step(pca, n_heads, next) == testing::decode_step(twin, n_heads, next));
}
