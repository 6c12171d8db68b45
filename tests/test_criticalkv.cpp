// CriticalKV (methods/criticalkv.cpp): on SnapKV's window scores, half of each head's prefix
// budget by attention alone, the rest by attention times ||W_o v||, so a value the output
// projection kills does not hold a slot; and the model gives the projection it needs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/model/llama_model.h"
#include "tests/cache_feed.h"
#include "tests/gguf_writer.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kKvHeads = 2, kHeads = 4, kDim = 4;
constexpr int64_t kContext = 40;

// One layer; query heads 0 and 1 (KV head 0) see all of a value through W_o (G = I), query
// heads 2 and 3 (KV head 1) only its channels 0 and 1 (G = diag(1, 1, 0, 0)).
KvShape criticalkv_shape() {
  KvShape shape{1, kKvHeads, kDim};
  shape.n_heads = kHeads;
  std::vector<float> gram(static_cast<size_t>(kHeads) * kDim * kDim, 0.f);
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t i = 0; i < kDim; ++i) gram[(h * kDim + i) * kDim + i] = (h < 2 || i < 2) ? 1.f : 0.f;
  }
  shape.value_out_gram = std::make_shared<const std::vector<float>>(gram);
  return shape;
}

// Every query points along channel 0; keys there are large at tokens 5, 10, 15, 20 (falling)
// and 25 (well below), zero elsewhere, so the window's attention ranks 5 > 10 > 15 > 20 > 25.
// Values are 0.01 in every channel but token 15's (0, 0, 10, 10), which KV head 1's projection
// kills, and token 25's (5, 5, 0, 0), which both heads' projections keep.
testing::Chunk context() {
  testing::Chunk c;
  c.n = kContext;
  c.k.assign(kContext * kKvHeads * kDim, 0.f);
  c.v.assign(c.k.size(), 0.01f);
  c.q.assign(kContext * kHeads * kDim, 0.f);
  const std::vector<std::pair<int64_t, float>> peaks = {
      {5, 6.f}, {10, 5.5f}, {15, 5.f}, {20, 4.5f}, {25, 3.f}};
  for (int64_t t = 0; t < kContext; ++t) {
    for (int32_t h = 0; h < kHeads; ++h) c.q[(t * kHeads + h) * kDim] = 4.f;
    for (int32_t g = 0; g < kKvHeads; ++g) {
      float* k = &c.k[(t * kKvHeads + g) * kDim];
      float* v = &c.v[(t * kKvHeads + g) * kDim];
      for (const auto& [token, size] : peaks) {
        if (t == token) k[0] = size;
      }
      if (t == 15) v[0] = v[1] = 0, v[2] = v[3] = 10;
      if (t == 25) v[0] = v[1] = 5, v[2] = v[3] = 0;
    }
  }
  return c;
}

std::vector<std::vector<int32_t>> kept_after_context(const std::string& spec) {
  KvCache cache = make_cache(spec, criticalkv_shape());
  testing::feed(cache, kHeads, context());
  cache.end_context();
  return {testing::kept(cache, 0, 0), testing::kept(cache, 0, 1)};
}

}  // namespace

TEST_CASE("criticalkv drops a well-attended token whose value the output projection kills",
          "[unit][criticalkv]") {
  // Budget 8: the window (36-39) and 4 prefix tokens per head; no pooling, so the scores are
  // the window's attention itself.
  const std::string params = "budget=8,window=4,kernel=1";
  const std::vector<int32_t> window = {36, 37, 38, 39};
  const auto with = [&](std::vector<int32_t> prefix) {
    prefix.insert(prefix.end(), window.begin(), window.end());
    return prefix;
  };
  // SnapKV keeps the four best attended in both heads.
  const auto snapkv = kept_after_context("snapkv:" + params);
  CHECK(snapkv[0] == with({5, 10, 15, 20}));
  CHECK(snapkv[1] == with({5, 10, 15, 20}));
  // CriticalKV keeps 5 and 10 by attention (stage 1, half the budget), then weighs the rest by
  // ||W_o v||: in KV head 0 token 15 (norm 14.1) and 25 (7.1) beat 20 (0.02); in KV head 1
  // token 15's value is projected to nothing, so 25 and then 20 are kept instead.
  const auto critical = kept_after_context("criticalkv:" + params);
  CHECK(critical[0] == with({5, 10, 15, 25}));
  CHECK(critical[1] == with({5, 10, 20, 25}));
  // The whole budget by attention alone is SnapKV's choice.
  CHECK(kept_after_context("criticalkv:" + params + ",first_stage_ratio=1") == snapkv);
  // With nothing kept by attention alone the weighted score picks all four; here the same:
  // KV head 1 ranks 25 (attention 0.0016 x norm 7.1) above 5 (0.64 x 0.014).
  const auto weighted = kept_after_context("criticalkv:" + params + ",first_stage_ratio=0");
  CHECK(weighted[0] == with({5, 10, 15, 25}));
  CHECK(weighted[1] == with({5, 10, 20, 25}));
  // AdaKV in front: both heads' plain scores are equal, so with no floor each keeps an even
  // 4, the same choice. AdaKV's default floor (int(4 x 0.2) = 0 tokens, 3.2 each) leaves 3
  // per head: stage 1 keeps int(3 x 0.5) = 1 (token 5), the weighted stage two more.
  CHECK(kept_after_context("adakv:floor=0+criticalkv:" + params) == critical);
  const auto ada = kept_after_context("adakv+criticalkv:" + params);
  CHECK(ada[0] == with({5, 15, 25}));
  CHECK(ada[1] == with({5, 10, 25}));
}

TEST_CASE("criticalkv refuses a shape without the output projection and bad parameters",
          "[unit][criticalkv]") {
  const KvShape bare{1, kKvHeads, kDim};
  CHECK_THROWS_AS(make_cache("criticalkv:budget=8,window=4", bare), InputError);
  CHECK_THROWS_AS(make_cache("adakv+criticalkv:budget=8,window=4", bare), InputError);
  KvShape wrong = criticalkv_shape();
  wrong.n_heads = 3;  // not a multiple of the KV heads
  CHECK_THROWS_AS(make_cache("criticalkv:budget=8,window=4", wrong), InputError);
  wrong.n_heads = 6;  // the Gram is for 4 query heads
  CHECK_THROWS_AS(make_cache("criticalkv:budget=8,window=4", wrong), InputError);
  for (const std::string bad : {"criticalkv:epsilon=-1", "criticalkv:first_stage_ratio=1.5",
                                "criticalkv:budget=8,window=16", "criticalkv:kernel=4",
                                "criticalkv:budget=8,ratio=0.5"}) {
    INFO(bad);
    CHECK_THROWS_AS(make_cache(bad, criticalkv_shape()), InputError);
  }
}

TEST_CASE("a loaded model gives W_o_h^T W_o_h per query head", "[unit][criticalkv]") {
  testing::TinyLlamaSpec spec;
  const std::string path = testing::temp_path("tiny_criticalkv.gguf");
  testing::write_tiny_llama_gguf(path, spec);
  const auto model = LlamaModel::load(path);
  const KvShape shape = model->kv_shape();
  CHECK(shape.n_heads == spec.n_head);
  REQUIRE(shape.value_out_gram);
  const int64_t d = shape.head_dim;
  REQUIRE(shape.value_out_gram->size() ==
          static_cast<size_t>(spec.n_layer * spec.n_head * d * d));
  // Each G_h is symmetric with a positive diagonal (a Gram of nonzero random columns).
  const std::vector<float>& gram = *shape.value_out_gram;
  for (int64_t m = 0; m < spec.n_layer * spec.n_head; ++m) {
    const float* g = gram.data() + m * d * d;
    for (int64_t i = 0; i < d; ++i) {
      CHECK(g[i * d + i] > 0.f);
      for (int64_t j = 0; j < i; ++j) CHECK(g[i * d + j] == Approx(g[j * d + i]));
    }
  }
  // And criticalkv runs on the model's own shape.
  CHECK_NOTHROW(make_cache("criticalkv:budget=64", shape));
}

namespace {

// The authors' CriticalKV (kvpress's CriticalKVPress over SnapKVPress), computed here on its
// own from one layer's keys, values and queries: SnapKV's score is each window row's softmax
// attention (causal), its MEAN over the window's rows and the GQA group's query heads (no
// pooling: kernel 1); stage 1 keeps a head's top int(B x ratio) by it, stage 2 the rest of
// its B by (score + epsilon) x ||W_o v||, the L2 norm through each query head's Gram, meaned
// over the group. `rows_sum` scores by the sum over rows instead (kvbench before the fix).
std::vector<std::vector<int32_t>> authors_kept(const testing::Chunk& c, int64_t budget,
                                               int64_t window, double epsilon, double ratio,
                                               bool rows_sum) {
  const KvShape shape = criticalkv_shape();
  const std::vector<float>& gram = *shape.value_out_gram;
  const int64_t n = c.n, n_prefix = n - window, b = budget - window;
  const int32_t group = kHeads / kKvHeads;
  std::vector<std::vector<int32_t>> kept(kKvHeads);
  for (int32_t g = 0; g < kKvHeads; ++g) {
    std::vector<double> score(static_cast<size_t>(n_prefix), 0.0), norm(score.size(), 0.0);
    for (int32_t h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t row = n_prefix; row < n; ++row) {
        std::vector<double> logit(static_cast<size_t>(row + 1));
        double top = -1e300, total = 0;
        for (int64_t t = 0; t <= row; ++t) {
          double dot = 0;
          for (int32_t i = 0; i < kDim; ++i) {
            dot += double{c.q[(row * kHeads + h) * kDim + i]} * c.k[(t * kKvHeads + g) * kDim + i];
          }
          logit[t] = dot / std::sqrt(double{kDim});
          top = std::max(top, logit[t]);
        }
        for (double& x : logit) total += (x = std::exp(x - top));
        for (int64_t t = 0; t < n_prefix; ++t) {
          score[t] += logit[t] / total / group / (rows_sum ? 1.0 : static_cast<double>(window));
        }
      }
      for (int64_t t = 0; t < n_prefix; ++t) {
        const float* v = &c.v[(t * kKvHeads + g) * kDim];
        double sq = 0;
        for (int32_t i = 0; i < kDim; ++i) {
          for (int32_t j = 0; j < kDim; ++j) sq += v[i] * double{gram[(h * kDim + i) * kDim + j]} * v[j];
        }
        norm[t] += std::sqrt(std::max(0.0, sq)) / group;
      }
    }
    std::vector<int64_t> order(static_cast<size_t>(n_prefix));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      return score[x] > score[y] || (score[x] == score[y] && x < y);
    });
    const int64_t first = static_cast<int64_t>(static_cast<double>(b) * ratio);
    std::vector<int64_t> rest(order.begin() + first, order.end());
    std::sort(rest.begin(), rest.end(), [&](int64_t x, int64_t y) {
      return (score[x] + epsilon) * norm[x] > (score[y] + epsilon) * norm[y];
    });
    for (int64_t i = 0; i < first; ++i) kept[g].push_back(static_cast<int32_t>(order[i]));
    for (int64_t i = 0; i < b - first; ++i) kept[g].push_back(static_cast<int32_t>(rest[i]));
    for (int64_t t = n_prefix; t < n; ++t) kept[g].push_back(static_cast<int32_t>(t));
    std::sort(kept[g].begin(), kept[g].end());
  }
  return kept;
}

}  // namespace

TEST_CASE("criticalkv keeps what the authors' formula keeps: epsilon on the mean over the "
          "window's rows", "[unit][criticalkv]") {
  // Random layers at a mean attention of about 1/40 per token, where an epsilon of 0.01
  // weighs in: on the sum over the 8 window rows it would weigh 8 times less.
  const int64_t budget = 16, window = 8;
  const double epsilon = 0.01;
  int differs_from_sum = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const testing::Chunk c = testing::random_chunk(kContext, criticalkv_shape(), kHeads, rng);
    KvCache cache = make_cache("criticalkv:budget=16,window=8,kernel=1,epsilon=0.01",
                               criticalkv_shape());
    testing::feed(cache, kHeads, c);
    cache.end_context();
    const auto expected = authors_kept(c, budget, window, epsilon, 0.5, false);
    CHECK(testing::kept(cache, 0, 0) == expected[0]);
    CHECK(testing::kept(cache, 0, 1) == expected[1]);
    differs_from_sum += expected != authors_kept(c, budget, window, epsilon, 0.5, true);
  }
  CHECK(differs_from_sum >= 3);  // the test tells the two scales apart
}
