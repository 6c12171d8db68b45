// Token scores for eviction policies: attention_scores_cpu against the double-precision
// reference, attention_dense_scored_cpu (attention and scores in one pass) against both
// kernels, nearest_columns_cpu against double dots, and the key-norm, anchor-cosine, pooling and top-k kernels on hand-built inputs.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <omp.h>
#include <random>
#include <vector>

#include "attention_problem.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/scores.h"

namespace {

using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;

using kvbench::attention_scores_cpu;
using kvbench::attention_scores_reference;
using kvbench::AttentionQuery;
using kvbench::DenseKv;
using kvbench::PoolKind;

constexpr int kGuard = 16;  // floats past the scores that no kernel may touch
constexpr float kGuardValue = -777.0f;

// Scores [n_heads, n_tokens] starting from `init`, followed by guard floats.
std::vector<float> run_scores(const AttentionProblem& p,
                              void (*fn)(const AttentionQuery&, const DenseKv&, float*),
                              float init = 0.0f) {
  const size_t size = static_cast<size_t>(p.query.n_heads * p.kv.n_tokens);
  std::vector<float> scores(size + kGuard, kGuardValue);
  std::fill(scores.begin(), scores.begin() + size, init);
  fn(p.query, p.kv, scores.data());
  return scores;
}

// Largest |got - expected| / (expected + floor) over all scores; NaN counts as infinitely far.
float max_rel_diff(const std::vector<float>& got, const std::vector<float>& expected, float floor) {
  float worst = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) {
    const float d = std::fabs(got[i] - expected[i]) / (std::fabs(expected[i]) + floor);
    worst = std::isnan(d) ? std::numeric_limits<float>::infinity() : std::max(worst, d);
  }
  return worst;
}

// Number of query rows (query, head) that see at least one stored key of their KV head.
int64_t rows_with_a_visible_key(const AttentionProblem& p) {
  const int group = p.query.n_heads / p.kv.n_kv_heads;
  int64_t rows = 0;
  for (int i = 0; i < p.query.n_queries; ++i) {
    for (int h = 0; h < p.query.n_heads; ++h) {
      const int32_t* pos = p.kv.positions + (h / group) * p.kv.capacity;
      rows += std::any_of(pos, pos + p.kv.n_tokens,
                          [&](int32_t x) { return x <= p.query.q_positions[i]; });
    }
  }
  return rows;
}

// Relative 1e-5 over a floor of 1e-6: each probability carries the fp32 error of its logit
// (a dot product of up to 128 terms, ~1e-6 relative through exp2) and of its row's sum; a
// token's score adds up to 600 of them in fp32. Seen: below 2e-6. Unseen tokens are 0 in both.
constexpr float kRelTol = 1e-5f;
constexpr float kFloor = 1e-6f;

void check_against_reference(const Case& c, uint32_t seed, int32_t first_query_position = -1) {
  AttentionProblem p(c, seed);
  if (first_query_position >= 0) p.q_positions[0] = first_query_position;
  const auto expected = run_scores(p, attention_scores_reference);
  const auto got = run_scores(p, attention_scores_cpu);
  INFO("head_dim " << c.head_dim << " heads " << c.n_heads << "/" << c.n_kv_heads << " tokens "
                   << c.n_tokens << " queries " << c.n_queries << " shuffled " << c.shuffled);
  const float diff = max_rel_diff(got, expected, kFloor);
  INFO("max relative difference " << diff);
  CHECK(diff <= kRelTol);
  for (int e = 0; e < kGuard; ++e) REQUIRE(got[got.size() - kGuard + e] == kGuardValue);
}

}  // namespace

TEST_CASE("attention_scores_cpu matches the reference over odd sizes", "[unit]") {
  for (int head_dim : {64, 128}) {
    for (auto [n_heads, n_kv_heads] : {std::pair{4, 4}, std::pair{9, 3}, std::pair{9, 1}}) {
      for (int64_t n_tokens : {1, 15, 17, 130, 1000}) {
        for (int n_queries : {1, 7, 32, 61}) {
          check_against_reference(Case{n_heads, n_kv_heads, head_dim, n_tokens, n_queries}, 1);
        }
      }
    }
  }
}

TEST_CASE("attention_scores_cpu: long contexts, many queries, shuffled positions", "[unit]") {
  // Same tolerance as above. 4097 and 5000 tokens cross tile and block-budget boundaries;
  // 600 queries make many blocks per slab; shuffled positions mask inside every tile.
  for (const Case& c :
       {Case{9, 3, 64, 4097, 1}, Case{9, 3, 64, 5000, 32}, Case{9, 3, 128, 4097, 9},
        Case{9, 1, 64, 600, 600}, Case{4, 4, 128, 300, 600}, Case{9, 3, 64, 1000, 64, true},
        Case{9, 1, 128, 4097, 7, true}, Case{4, 4, 64, 17, 600, true}}) {
    check_against_reference(c, 2);
  }
}

TEST_CASE("attention_scores_cpu: a query that sees no key contributes nothing", "[unit]") {
  // Stored positions start at 5: a query at 4 is fully masked, in the direct and GEMM paths.
  for (const Case& c : {Case{9, 3, 64, 15, 1}, Case{9, 3, 64, 15, 2}, Case{4, 4, 128, 1000, 40}}) {
    check_against_reference(c, 3, 4);
    AttentionProblem p(c, 3);
    p.q_positions[0] = 4;
    if (c.n_queries == 1) {
      const auto got = run_scores(p, attention_scores_cpu);
      for (int64_t e = 0; e < c.n_heads * c.n_tokens; ++e) REQUIRE(got[e] == 0.0f);
    }
  }
}

TEST_CASE("attention_scores_cpu: each visible query row adds probabilities summing to 1",
          "[unit]") {
  // Relative 1e-5 of the total: every row's probabilities are normalised by their own fp32
  // sum (error ~ n_tokens ulps at worst), then the totals add them in fp32 and double.
  for (const Case& c :
       {Case{9, 3, 64, 4097, 1}, Case{9, 3, 64, 700, 100, true}, Case{4, 4, 128, 64, 33}}) {
    AttentionProblem p(c, 4);
    p.q_positions[0] = 4;  // one fully masked query
    const auto got = run_scores(p, attention_scores_cpu);
    double total = 0.0;
    for (int64_t e = 0; e < c.n_heads * c.n_tokens; ++e) total += got[e];
    const auto rows = static_cast<double>(rows_with_a_visible_key(p));
    INFO("tokens " << c.n_tokens << " queries " << c.n_queries);
    CHECK(rows < static_cast<double>(c.n_queries) * c.n_heads);
    CHECK(std::fabs(total - rows) <= 1e-5 * rows);
  }
}

TEST_CASE("attention_scores_cpu adds into the scores it is given", "[unit]") {
  // The second call adds the same values again; a start of 1 comes out as 1 + the scores.
  // 1e-5 relative: each query row's probability is added onto a larger running value than
  // from zero, one fp32 rounding of it per row (64 rows x 6e-8).
  for (const Case& c : {Case{9, 3, 64, 1000, 1}, Case{9, 3, 64, 1000, 64}}) {
    AttentionProblem p(c, 5);
    const auto once = run_scores(p, attention_scores_cpu);
    auto twice = once;
    attention_scores_cpu(p.query, p.kv, twice.data());
    auto from_one = run_scores(p, attention_scores_cpu, 1.0f);
    for (int64_t e = 0; e < c.n_heads * c.n_tokens; ++e) {
      REQUIRE(std::fabs(twice[e] - 2.0f * once[e]) <= 1e-5f * (2.0f * once[e]));
      REQUIRE(std::fabs(from_one[e] - (1.0f + once[e])) <= 1e-5f * (1.0f + once[e]));
    }
    for (int e = 0; e < kGuard; ++e) REQUIRE(twice[twice.size() - kGuard + e] == kGuardValue);
  }
}

TEST_CASE("attention_dense_scored_cpu: the dense kernel's output bit for bit, and the scores",
          "[unit]") {
  // On 2 threads (the plans depend on the count): queries in enough tiles take the one-pass
  // path (every tile's numerators rescaled to the row's final max), and few queries over
  // 1,024 keys or more take attention then attention_scores_cpu (keys split): the 4097- and
  // 1100-token cases. Scores as attention_scores_cpu against the reference; called again,
  // they add.
  struct TwoThreads {
    int saved = omp_get_max_threads();
    TwoThreads() { omp_set_num_threads(2); }
    ~TwoThreads() { omp_set_num_threads(saved); }
  } two_threads;
  for (const Case& c :
       {Case{9, 3, 64, 4097, 1}, Case{9, 3, 64, 1000, 7}, Case{9, 3, 64, 300, 384},
        Case{14, 2, 64, 300, 230, true}, Case{4, 4, 128, 130, 61}, Case{9, 1, 64, 17, 600},
        Case{12, 2, 128, 1100, 16}}) {
    AttentionProblem p(c, 5);
    p.q_positions[0] = 4;  // one fully masked query: zeros out, nothing added
    INFO("heads " << c.n_heads << "/" << c.n_kv_heads << " dim " << c.head_dim << " tokens "
                  << c.n_tokens << " queries " << c.n_queries);
    const std::vector<float> dense = p.run(kvbench::attention_dense_cpu);
    std::vector<float> out(p.q.size(), 123.0f);
    AttentionQuery query = p.query;
    query.out = out.data();
    const size_t size = static_cast<size_t>(c.n_heads * c.n_tokens);
    std::vector<float> scores(size + kGuard, kGuardValue);
    std::fill(scores.begin(), scores.begin() + size, 0.0f);
    kvbench::attention_dense_scored_cpu(query, p.kv, scores.data());
    REQUIRE(out == dense);
    const auto expected = run_scores(p, attention_scores_reference);
    CHECK(max_rel_diff(scores, expected, kFloor) <= kRelTol);
    const std::vector<float> once = scores;
    kvbench::attention_dense_scored_cpu(query, p.kv, scores.data());
    for (size_t i = 0; i < size; ++i) REQUIRE(std::fabs(scores[i] - 2 * once[i]) <= 1e-5f * once[i]);
    for (int e = 0; e < kGuard; ++e) REQUIRE(scores[size + e] == kGuardValue);
  }
}

TEST_CASE("nearest_columns_cpu: each row's largest product, the first of equals", "[unit]") {
  // 600 rows cross the kernel's blocks of 256; column 3 duplicates column 7 so that rows
  // whose best is column 7 must report 3. The products are compared with double dots within
  // fp32 rounding of 64 terms; the chosen column's product must be the best within that.
  constexpr int kDim = 64;
  constexpr int64_t kRows = 600, kCols = 100;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> a(kRows * kDim), b(kDim * kCols);
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  for (int d = 0; d < kDim; ++d) b[d * kCols + 3] = b[d * kCols + 7];
  std::vector<int64_t> best(kRows);
  std::vector<float> best_dot(kRows);
  kvbench::nearest_columns_cpu(a.data(), kRows, kDim, b.data(), kCols, best.data(), best_dot.data());
  int64_t tied = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    std::vector<double> dots(kCols, 0.0);
    for (int64_t j = 0; j < kCols; ++j) {
      for (int d = 0; d < kDim; ++d) dots[j] += double{a[r * kDim + d]} * b[d * kCols + j];
    }
    const double top = *std::max_element(dots.begin(), dots.end());
    INFO("row " << r);
    REQUIRE(best[r] != 7);
    CHECK(std::fabs(best_dot[r] - dots[best[r]]) <= 1e-4);
    CHECK(dots[best[r]] >= top - 1e-4);
    tied += best[r] == 3;
  }
  CHECK(tied > 0);
}

TEST_CASE("key_norms_cpu and key_anchor_cosine_cpu on hand-built keys", "[unit]") {
  // Two KV heads of three 2-d keys, capacity 4 with NaN slack that must never be read.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> k = {2, 0, 0, 3, 0,  0,  nan, nan,   // head 0: x, y, zero key
                                1, 1, 2, 2, -1, -1, nan, nan};  // head 1: one direction
  const std::vector<int32_t> positions = {0, 1, 2, -1, 0, 1, 2, -1};
  const DenseKv kv{k.data(), k.data(), positions.data(), 2, 2, 4, 3};
  // 1e-6 absolute: one fp32 dot product and square root of small integers.
  std::vector<float> norms(6, kGuardValue);
  kvbench::key_norms_cpu(kv, norms.data());
  const float expected_norms[] = {2, 3, 0, std::sqrt(2.0f), std::sqrt(8.0f), std::sqrt(2.0f)};
  for (int e = 0; e < 6; ++e) CHECK(std::fabs(norms[e] - expected_norms[e]) <= 1e-6f);
  // Head 0: anchor (1/3, 1/3), both axis keys at 45 degrees, the zero key 0 (guarded).
  // Head 1: anchor (1, 1) / (3 sqrt 2): two keys along it, one against it.
  std::vector<float> cosine(6, kGuardValue);
  kvbench::key_anchor_cosine_cpu(kv, cosine.data());
  const float r = 1.0f / std::sqrt(2.0f);
  const float expected_cosine[] = {r, r, 0, 1, 1, -1};
  for (int e = 0; e < 6; ++e) CHECK(std::fabs(cosine[e] - expected_cosine[e]) <= 1e-6f);

  // Opposite unit keys: the anchor is zero and every cosine is 0, not NaN.
  const std::vector<float> opposite = {1, 0, -1, 0};
  const DenseKv kv2{opposite.data(), opposite.data(), positions.data(), 1, 2, 2, 2};
  std::vector<float> cos2(2, kGuardValue);
  kvbench::key_anchor_cosine_cpu(kv2, cos2.data());
  CHECK(cos2[0] == 0.0f);
  CHECK(cos2[1] == 0.0f);
}

TEST_CASE("pool1d_cpu follows PyTorch's padded pooling", "[unit]") {
  // Exact up to one fp32 rounding per window sum and divide (1e-6 absolute).
  const std::vector<float> in = {1,  2,  3,  4,  5,    // row 0
                                 -1, -2, -3, -4, -5};  // row 1: max must not see the zero padding
  std::vector<float> out(in.size());
  const auto check_rows = [&](const std::vector<float>& expected) {
    for (size_t e = 0; e < in.size(); ++e) CHECK(std::fabs(out[e] - expected[e]) <= 1e-6f);
  };
  kvbench::pool1d_cpu(in.data(), out.data(), 2, 5, 3, PoolKind::Avg);
  // Borders: (0 + 1 + 2) / 3 and (4 + 5 + 0) / 3, padding counted in the divisor.
  check_rows({1, 2, 3, 4, 3, -1, -2, -3, -4, -3});
  kvbench::pool1d_cpu(in.data(), out.data(), 2, 5, 3, PoolKind::Max);
  check_rows({2, 3, 4, 5, 5, -1, -1, -2, -3, -4});
  kvbench::pool1d_cpu(in.data(), out.data(), 2, 5, 1, PoolKind::Avg);
  check_rows(in);
  // A window wider than the row: reaches 3 each side, clipped, always divided by 7.
  kvbench::pool1d_cpu(in.data(), out.data(), 2, 5, 7, PoolKind::Avg);
  check_rows({10.0f / 7, 15.0f / 7, 15.0f / 7, 15.0f / 7, 14.0f / 7,  //
              -10.0f / 7, -15.0f / 7, -15.0f / 7, -15.0f / 7, -14.0f / 7});
  kvbench::pool1d_cpu(in.data(), out.data(), 2, 5, 7, PoolKind::Max);
  check_rows({4, 5, 5, 5, 5, -1, -1, -1, -1, -2});
}

TEST_CASE("top_k_indices_cpu: k largest, ties to the lower index, ascending", "[unit]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> values = {3,   1, 3,  2, 3,  // ties at 0, 2, 4
                                     nan, 5, -1, 5, 0};
  std::vector<int32_t> out(10, -7);
  kvbench::top_k_indices_cpu(values.data(), 2, 5, 2, out.data());
  CHECK(std::vector<int32_t>(out.begin(), out.begin() + 4) == std::vector<int32_t>{0, 2, 1, 3});
  kvbench::top_k_indices_cpu(values.data(), 2, 5, 4, out.data());
  CHECK(std::vector<int32_t>(out.begin(), out.begin() + 8) ==
        std::vector<int32_t>{0, 2, 3, 4, 1, 2, 3, 4});  // NaN ranks last
  kvbench::top_k_indices_cpu(values.data(), 2, 5, 5, out.data());
  CHECK(out == std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4});
  std::fill(out.begin(), out.end(), -7);
  kvbench::top_k_indices_cpu(values.data(), 2, 5, 0, out.data());
  CHECK(std::all_of(out.begin(), out.end(), [](int32_t x) { return x == -7; }));

  // Random rows with many ties against a full stable sort.
  std::mt19937 rng(11);
  const int64_t rows = 5, n = 1000;
  std::vector<float> random(rows * n);
  for (auto& x : random) x = static_cast<float>(rng() % 50);
  for (int64_t k : {1, 37, 999}) {
    std::vector<int32_t> got(rows * k);
    kvbench::top_k_indices_cpu(random.data(), rows, n, k, got.data());
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      const float* v = random.data() + r * n;
      std::stable_sort(order.begin(), order.end(),
                       [v](int32_t a, int32_t b) { return v[a] > v[b]; });
      std::sort(order.begin(), order.begin() + k);
      INFO("k " << k << " row " << r);
      CHECK(std::equal(order.begin(), order.begin() + k, got.begin() + r * k));
    }
  }
}

TEST_CASE("attention_row_scores_cpu: each query row's probabilities, as the reference over that "
          "row alone",
          "[unit]") {
  // The direct and GEMM paths, many blocks, shuffled positions, and a fully masked first row.
  for (const Case& c :
       {Case{9, 3, 64, 130, 2}, Case{9, 3, 64, 130, 7}, Case{9, 3, 64, 1000, 64, true},
        Case{4, 4, 128, 4097, 9}, Case{14, 2, 64, 600, 100, true}}) {
    AttentionProblem p(c, 4);
    p.q_positions[0] = 4;  // sees no stored key (they start at 5): a row of zeros
    const int64_t row = static_cast<int64_t>(c.n_heads) * c.n_tokens;
    std::vector<float> got(c.n_queries * row + kGuard, kGuardValue);
    kvbench::attention_row_scores_cpu(p.query, p.kv, got.data());
    for (int e = 0; e < kGuard; ++e) REQUIRE(got[c.n_queries * row + e] == kGuardValue);
    float worst = 0.0f;
    for (int i = 0; i < c.n_queries; ++i) {
      AttentionQuery one = p.query;  // row i alone
      one.q += static_cast<int64_t>(i) * c.n_heads * c.head_dim;
      one.q_positions += i;
      one.n_queries = 1;
      std::vector<float> expected(row, 0.0f);
      attention_scores_reference(one, p.kv, expected.data());
      const std::vector<float> got_row(got.begin() + i * row, got.begin() + (i + 1) * row);
      worst = std::max(worst, max_rel_diff(got_row, expected, kFloor));
    }
    INFO("heads " << c.n_heads << "/" << c.n_kv_heads << " tokens " << c.n_tokens << " queries "
                  << c.n_queries << ": max relative difference " << worst);
    CHECK(worst <= kRelTol);
    CHECK(std::all_of(got.begin(), got.begin() + row, [](float x) { return x == 0.0f; }));
  }
}
