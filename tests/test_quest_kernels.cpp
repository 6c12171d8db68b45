// Quest's kernels against their references: gathered attention over selected pages
// (attention_pages_cpu), page key bounds built as tokens arrive (page_bounds_append_cpu),
// the per-page logit bound that picks pages (page_scores_cpu); and the adjacent-key cosine
// merging methods use (adjacent_key_cosine_cpu).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "attention_problem.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/quest.h"
#include "page_picks.h"
#include "random_floats.h"

namespace {

using kvbench::AttentionQuery;
using kvbench::DenseKv;
using kvbench::PageBounds;
using kvbench::PageSelection;
using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;
using kvbench::testing::max_abs_diff;
using kvbench::testing::pages_of;
using kvbench::testing::Pick;
using kvbench::testing::pick_pages;
using kvbench::testing::random_floats;

std::vector<float> run_pages(AttentionProblem& p, const PageSelection& pages, bool reference) {
  std::vector<float> out(p.q.size(), 123.0f);
  AttentionQuery q = p.query;
  q.out = out.data();
  if (reference) {
    kvbench::attention_pages_reference(q, p.kv, pages);
  } else {
    kvbench::attention_pages_cpu(q, p.kv, pages);
  }
  return out;
}

// Dense attention over only the selected slots, copied out per KV head: an oracle for the
// page kernels that shares no code with attention_pages_reference.
std::vector<float> compacted_dense_reference(const AttentionProblem& p,
                                             const PageSelection& pages) {
  const DenseKv& kv = p.kv;
  std::vector<std::vector<int64_t>> slots(kv.n_kv_heads);
  for (int h = 0; h < kv.n_kv_heads; ++h) {
    for (int s = 0; s < pages.n_selected; ++s) {
      const int64_t page = pages.pages[h * pages.n_selected + s];
      for (int64_t t = page * pages.page_tokens;
           t < std::min(kv.n_tokens, (page + 1) * pages.page_tokens); ++t) {
        slots[h].push_back(t);
      }
    }
  }
  // Heads may keep different numbers of slots: pad the shorter ones with invisible slots.
  int64_t n = 0;
  for (const auto& s : slots) n = std::max<int64_t>(n, static_cast<int64_t>(s.size()));
  std::vector<float> k(std::max<int64_t>(1, kv.n_kv_heads * n * kv.head_dim), 0.0f), v(k);
  std::vector<int32_t> pos(std::max<int64_t>(1, kv.n_kv_heads * n),
                           std::numeric_limits<int32_t>::max());
  for (int h = 0; h < kv.n_kv_heads; ++h) {
    for (size_t j = 0; j < slots[h].size(); ++j) {
      const int64_t src = (h * kv.capacity + slots[h][j]) * kv.head_dim;
      std::copy(kv.k + src, kv.k + src + kv.head_dim, k.begin() + (h * n + j) * kv.head_dim);
      std::copy(kv.v + src, kv.v + src + kv.head_dim, v.begin() + (h * n + j) * kv.head_dim);
      pos[h * n + j] = kv.positions[h * kv.capacity + slots[h][j]];
    }
  }
  const DenseKv compact{k.data(), v.data(), pos.data(), kv.n_kv_heads, kv.head_dim, n, n};
  std::vector<float> out(p.q.size(), 123.0f);
  AttentionQuery q = p.query;
  q.out = out.data();
  kvbench::attention_dense_reference(q, compact);
  return out;
}

}  // namespace

TEST_CASE("attention_pages_cpu matches the reference over odd sizes and selections",
          "[unit][quest][attention_pages]") {
  // 2e-5 absolute, as attention_dense_cpu's test: outputs are convex combinations of values
  // in [-1, 1], fp32 online softmax against a double two-pass reference.
  const float tol = 2e-5f;
  for (int head_dim : {64, 128}) {
    for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{4, 4}}) {
      for (int64_t n_tokens : {1, 15, 17, 4097}) {
        for (int n_queries : {1, 7}) {
          for (int page_tokens : {16, 5}) {
            for (Pick pick : {Pick::Last, Pick::All, Pick::Random, Pick::Alternate}) {
              AttentionProblem p(
                  Case{n_heads, n_kv_heads, head_dim, n_tokens, n_queries, n_queries > 1},
                  static_cast<uint32_t>(n_tokens + head_dim));
              int n_selected = 0;
              const auto sel = pick_pages(pick, n_kv_heads, pages_of(n_tokens, page_tokens),
                                          static_cast<uint32_t>(n_tokens), n_selected);
              const PageSelection pages{sel.data(), n_selected, page_tokens};
              INFO("head_dim " << head_dim << " heads " << n_heads << "/" << n_kv_heads
                               << " tokens " << n_tokens << " queries " << n_queries
                               << " page_tokens " << page_tokens << " pick "
                               << static_cast<int>(pick) << " selected " << n_selected);
              const auto expected = run_pages(p, pages, true);
              CHECK(max_abs_diff(run_pages(p, pages, false), expected) <= tol);
              CHECK(max_abs_diff(compacted_dense_reference(p, pages), expected) <= 1e-6f);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("attention_pages_cpu: a decode query over selected pages of a long context",
          "[unit][quest][attention_pages]") {
  // Quest's decode shape (split over the selected pages): 9/3 heads, pages of 16, a query
  // past every key; the pages not selected hold NaN, so reading one would show. 2e-5 as above.
  for (int64_t n_tokens : {4097, 8192, 9000}) {
    for (int n_selected : {1, 7, 64, 200}) {
      AttentionProblem p(Case{9, 3, 64, n_tokens, 1}, 11);
      p.q_positions[0] = std::numeric_limits<int32_t>::max();
      const int64_t n_pages = pages_of(n_tokens, 16);
      std::mt19937 rng(static_cast<uint32_t>(n_selected));
      std::vector<int32_t> sel;
      for (int h = 0; h < 3; ++h) {
        std::vector<int32_t> all(n_pages - 1);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(n_selected - 1);
        all.push_back(static_cast<int32_t>(n_pages - 1));
        std::sort(all.begin(), all.end());
        std::vector<bool> chosen(n_pages, false);
        for (int32_t pg : all) chosen[pg] = true;
        for (int64_t t = 0; t < n_tokens; ++t) {
          if (chosen[t / 16]) continue;
          for (int d = 0; d < 64; ++d) {
            p.k[(h * p.kv.capacity + t) * 64 + d] = std::numeric_limits<float>::quiet_NaN();
            p.v[(h * p.kv.capacity + t) * 64 + d] = std::numeric_limits<float>::quiet_NaN();
          }
        }
        sel.insert(sel.end(), all.begin(), all.end());
      }
      const PageSelection pages{sel.data(), n_selected, 16};
      INFO("tokens " << n_tokens << " selected " << n_selected);
      const auto got = run_pages(p, pages, false);
      CHECK(max_abs_diff(got, run_pages(p, pages, true)) <= 2e-5f);
      CHECK(max_abs_diff(got, compacted_dense_reference(p, pages)) <= 2e-5f);
    }
  }
}

TEST_CASE("attention_pages_cpu with every page selected is dense attention",
          "[unit][quest][attention_pages]") {
  // 2e-5 absolute against attention_dense_reference: the same keys, read as pages.
  for (int64_t n_tokens : {1, 15, 17, 4097}) {
    for (int n_queries : {1, 7, 64}) {
      for (int page_tokens : {16, 64, 100}) {
        AttentionProblem p(Case{9, 3, 64, n_tokens, n_queries, true}, 3);
        int n_selected = 0;
        const auto sel = pick_pages(Pick::All, 3, pages_of(n_tokens, page_tokens), 1, n_selected);
        INFO("tokens " << n_tokens << " queries " << n_queries << " page_tokens " << page_tokens);
        CHECK(max_abs_diff(run_pages(p, PageSelection{sel.data(), n_selected, page_tokens}, false),
                           p.run(kvbench::attention_dense_reference)) <= 2e-5f);
      }
    }
  }
}

TEST_CASE("attention_pages_cpu: no page selected, or no visible key, gives zeros",
          "[unit][quest][attention_pages]") {
  // Exact: nothing is attended, so every output is 0 by convention.
  for (int n_queries : {1, 7}) {
    AttentionProblem p(Case{4, 4, 128, 4097, n_queries}, 5);
    const PageSelection none{nullptr, 0, 16};
    for (float x : run_pages(p, none, false)) REQUIRE(x == 0.0f);
    // Every stored position is >= 5: a query at position 4 sees none of the first page.
    p.q_positions[0] = 4;
    const std::vector<int32_t> first(4, 0);
    const auto got = run_pages(p, PageSelection{first.data(), 1, 16}, false);
    for (int e = 0; e < 4 * 128; ++e) REQUIRE(got[e] == 0.0f);
  }
}

TEST_CASE("page_bounds_append_cpu built incrementally equals the bounds of every page's keys",
          "[unit][quest]") {
  // Exact: bounds are elementwise min/max of stored floats, whatever the append sizes.
  for (int head_dim : {64, 128}) {
    for (int page_tokens : {16, 5}) {
      const int n_kv_heads = 3;
      const int64_t n_tokens = 1 + 15 + 17 + 1 + 33 + 4097;
      const auto k = random_floats(static_cast<size_t>(n_tokens) * n_kv_heads * head_dim,
                                   static_cast<uint32_t>(head_dim + page_tokens));
      const int64_t cap = pages_of(n_tokens, page_tokens) + 3;
      const size_t size = static_cast<size_t>(n_kv_heads * cap * head_dim);
      // Stale contents: a page's first key must overwrite them, not fold into them.
      std::vector<float> lo_step(size, -1e30f), hi_step(size, 1e30f);
      std::vector<float> lo_once(size, 7.0f), hi_once(size, 7.0f);
      PageBounds step{lo_step.data(), hi_step.data(), n_kv_heads, head_dim, page_tokens, cap, 0};
      PageBounds once{lo_once.data(), hi_once.data(), n_kv_heads, head_dim, page_tokens, cap, 0};
      int64_t slot = 0;
      for (int64_t n : {1, 15, 17, 1, 33, 4097}) {  // crosses page boundaries mid-append
        kvbench::page_bounds_append_cpu(step, k.data() + slot * n_kv_heads * head_dim, slot, n);
        slot += n;
        REQUIRE(step.n_pages == pages_of(slot, page_tokens));
      }
      kvbench::page_bounds_append_cpu(once, k.data(), 0, n_tokens);
      const int64_t n_pages = pages_of(n_tokens, page_tokens);
      REQUIRE(once.n_pages == n_pages);
      INFO("head_dim " << head_dim << " page_tokens " << page_tokens);
      for (int h = 0; h < n_kv_heads; ++h) {
        for (int64_t pg = 0; pg < n_pages; ++pg) {
          for (int d = 0; d < head_dim; ++d) {
            // Brute force over the page's keys.
            float lo = std::numeric_limits<float>::infinity(), hi = -lo;
            for (int64_t t = pg * page_tokens; t < std::min(n_tokens, (pg + 1) * page_tokens);
                 ++t) {
              const float x = k[(t * n_kv_heads + h) * head_dim + d];
              lo = std::min(lo, x);
              hi = std::max(hi, x);
              REQUIRE(lo_step[(h * cap + pg) * head_dim + d] <= x);
              REQUIRE(x <= hi_step[(h * cap + pg) * head_dim + d]);
            }
            const int64_t at = (h * cap + pg) * head_dim + d;
            REQUIRE(lo_step[at] == lo);
            REQUIRE(hi_step[at] == hi);
            REQUIRE(lo_once[at] == lo);
            REQUIRE(hi_once[at] == hi);
          }
        }
      }
    }
  }
}

TEST_CASE("page_scores_cpu matches the reference and bounds every key's logit", "[unit][quest]") {
  for (int head_dim : {64, 128}) {
    for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{4, 4}, std::pair{10, 2}}) {
      for (int64_t n_tokens : {1, 15, 17, 4097}) {
        const int page_tokens = 16, n_queries = 3;
        const int group = n_heads / n_kv_heads;
        const auto k = random_floats(static_cast<size_t>(n_tokens) * n_kv_heads * head_dim, 1);
        const auto q = random_floats(static_cast<size_t>(n_queries) * n_heads * head_dim, 2);
        const int64_t n_pages = pages_of(n_tokens, page_tokens), cap = n_pages + 2;
        std::vector<float> lo(static_cast<size_t>(n_kv_heads * cap * head_dim));
        std::vector<float> hi(lo.size());
        PageBounds bounds{lo.data(), hi.data(), n_kv_heads, head_dim, page_tokens, cap, 0};
        kvbench::page_bounds_append_cpu(bounds, k.data(), 0, n_tokens);
        std::vector<int32_t> q_pos(n_queries, 0);
        const AttentionQuery query{q.data(), q_pos.data(), nullptr, n_queries, n_heads, 1.0f};
        for (int row = 0; row < n_queries; ++row) {
          std::vector<float> got(n_kv_heads * n_pages + 1, 99.0f), expected(got);
          kvbench::page_scores_cpu(query, row, bounds, got.data());
          kvbench::page_scores_reference(query, row, bounds, expected.data());
          INFO("head_dim " << head_dim << " heads " << n_heads << "/" << n_kv_heads << " tokens "
                           << n_tokens << " row " << row);
          REQUIRE(got.back() == 99.0f);  // nothing written past [n_kv_heads, n_pages]
          for (int h = 0; h < n_kv_heads; ++h) {
            for (int64_t pg = 0; pg < n_pages; ++pg) {
              const float score = got[h * n_pages + pg];
              // 1e-5 relative to the sum of |terms| (head_dim terms of normal(0,1)^2 size):
              // fp32 fused multiply-adds against a double sum.
              double magnitude = 0.0;
              for (int g = 0; g < group; ++g) {
                const float* qh = q.data() + (row * n_heads + h * group + g) * head_dim;
                for (int d = 0; d < head_dim; ++d) {
                  magnitude +=
                      std::fabs(qh[d]) * std::max(std::fabs(lo[(h * cap + pg) * head_dim + d]),
                                                  std::fabs(hi[(h * cap + pg) * head_dim + d]));
                }
              }
              const double eps = 1e-5 * magnitude + 1e-6;
              REQUIRE(std::fabs(score - expected[h * n_pages + pg]) <= eps);
              // The bound: no query head of the group gets a larger logit from any key.
              for (int g = 0; g < group; ++g) {
                const float* qh = q.data() + (row * n_heads + h * group + g) * head_dim;
                for (int64_t t = pg * page_tokens; t < std::min(n_tokens, (pg + 1) * page_tokens);
                     ++t) {
                  double dot = 0.0;
                  for (int d = 0; d < head_dim; ++d) {
                    dot += static_cast<double>(qh[d]) * k[(t * n_kv_heads + h) * head_dim + d];
                  }
                  REQUIRE(dot <= score + eps);
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("page_scores_cpu: a one-key page's bound is the largest logit of its group",
          "[unit][quest]") {
  // With min = max = k, the bound is exactly max_g q_g . k (up to fp32 rounding, 1e-4).
  const int n_heads = 9, n_kv_heads = 3, dim = 64;
  const auto k = random_floats(n_kv_heads * dim, 3);
  const auto q = random_floats(n_heads * dim, 4);
  std::vector<float> lo(n_kv_heads * dim), hi(lo.size());
  PageBounds bounds{lo.data(), hi.data(), n_kv_heads, dim, 16, 1, 0};
  kvbench::page_bounds_append_cpu(bounds, k.data(), 0, 1);
  const int32_t q_pos = 0;
  const AttentionQuery query{q.data(), &q_pos, nullptr, 1, n_heads, 1.0f};
  std::vector<float> scores(n_kv_heads);
  kvbench::page_scores_cpu(query, 0, bounds, scores.data());
  for (int h = 0; h < n_kv_heads; ++h) {
    double best = -1e30;
    for (int g = 0; g < 3; ++g) {
      double dot = 0.0;
      for (int d = 0; d < dim; ++d) dot += q[(h * 3 + g) * dim + d] * k[h * dim + d];
      best = std::max(best, dot);
    }
    CHECK(scores[h] == Approx(best).margin(1e-4));
  }
}

TEST_CASE("adjacent_key_cosine_cpu matches the reference in a shuffled order", "[unit][merge]") {
  // 1e-5 absolute: a cosine is in [-1, 1]; fp32 dot products of 64-128 terms against double.
  for (int head_dim : {64, 128}) {
    for (int64_t n_tokens : {1, 2, 15, 17, 513, 4097}) {
      const int n_kv_heads = 3;
      const int64_t cap = n_tokens + 5;
      auto k = random_floats(static_cast<size_t>(n_kv_heads * cap * head_dim),
                             static_cast<uint32_t>(n_tokens));
      // Some zero keys, including two adjacent in the order below.
      std::mt19937 rng(static_cast<uint32_t>(head_dim));
      std::vector<int32_t> order(n_kv_heads * n_tokens);
      for (int h = 0; h < n_kv_heads; ++h) {
        std::iota(order.begin() + h * n_tokens, order.begin() + (h + 1) * n_tokens, 0);
        std::shuffle(order.begin() + h * n_tokens, order.begin() + (h + 1) * n_tokens, rng);
        for (int64_t i : {int64_t{0}, n_tokens / 2, n_tokens / 2 + 1}) {
          if (i >= n_tokens) continue;
          const int64_t slot = order[h * n_tokens + i];
          std::fill_n(k.begin() + (h * cap + slot) * head_dim, head_dim, 0.0f);
        }
      }
      std::vector<int32_t> positions(n_kv_heads * cap, 0);
      const DenseKv kv{k.data(), k.data(), positions.data(), n_kv_heads, head_dim, cap, n_tokens};
      std::vector<float> got(n_kv_heads * n_tokens + 1, 99.0f), expected(got);
      kvbench::adjacent_key_cosine_cpu(kv, order.data(), got.data());
      kvbench::adjacent_key_cosine_reference(kv, order.data(), expected.data());
      INFO("head_dim " << head_dim << " tokens " << n_tokens);
      REQUIRE(got.back() == 99.0f);
      for (int h = 0; h < n_kv_heads; ++h) {
        for (int64_t i = 0; i < n_tokens; ++i) {
          const float s = got[h * n_tokens + i];
          REQUIRE(std::fabs(s - expected[h * n_tokens + i]) <= 1e-5f);
          if (i + 1 == n_tokens) REQUIRE(s == 0.0f);
          const bool zero_pair = i + 1 < n_tokens && (i == 0 || i + 1 == n_tokens / 2 ||
                                                      i == n_tokens / 2 || i == n_tokens / 2 + 1);
          if (zero_pair) REQUIRE(s == 0.0f);
        }
      }
    }
  }
}

TEST_CASE("adjacent_key_cosine_cpu on hand-built keys", "[unit][merge]") {
  // Exact up to 1e-6: parallel keys give 1, opposite -1, orthogonal 0, any zero key 0.
  const int dim = 8;
  std::vector<float> k(6 * dim, 0.0f);
  k[0 * dim + 0] = 1.0f;   // e0
  k[1 * dim + 0] = 3.0f;   // 3 e0: parallel to slot 0
  k[2 * dim + 0] = -2.0f;  // opposite
  k[3 * dim + 1] = 5.0f;   // e1: orthogonal
  // slot 4 stays zero; slot 5 = e1
  k[5 * dim + 1] = 1.0f;
  const std::vector<int32_t> positions(6, 0);
  const std::vector<int32_t> order = {0, 1, 2, 3, 4, 5};
  const DenseKv kv{k.data(), k.data(), positions.data(), 1, dim, 6, 6};
  std::vector<float> sim(6, 99.0f);
  kvbench::adjacent_key_cosine_cpu(kv, order.data(), sim.data());
  const std::vector<float> expected = {1.0f, -1.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < 6; ++i) CHECK(sim[i] == Approx(expected[i]).margin(1e-6));
}
