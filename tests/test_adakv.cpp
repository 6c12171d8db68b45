// Heads of their own (DenseLayerKv after a ragged plan) and AdaKV's head-wise budgets
// (methods/adakv.cpp): a ragged layer attends as a dense one whose dropped slots are masked,
// holds exactly the bytes of what each head keeps, and AdaKV splits a layer's budget by the
// scores of all its heads together.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "cache/allocation.h"
#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"
#include "tests/retain_plans.h"

using namespace kvbench;
using kvbench::testing::ragged_plan;

namespace {

constexpr int32_t kKvHeads = 2, kHeads = 4, kDim = 8;
constexpr int64_t kTokenBytes = 2 * kDim * sizeof(float) + sizeof(int32_t);

// Attention of `q` ([n_queries, kHeads, kDim] at `q_pos`) over the tokens each KV head keeps
// (keys and values as appended: [n, kKvHeads, kDim], position = index), plain softmax.
std::vector<float> masked_reference(const testing::Chunk& all, const std::vector<float>& q,
                                    const std::vector<int32_t>& q_pos,
                                    const std::vector<std::vector<int32_t>>& kept) {
  const int64_t n_q = static_cast<int64_t>(q_pos.size());
  std::vector<float> out(n_q * kHeads * kDim, 0.f);
  const float scale = 1.f / std::sqrt(static_cast<float>(kDim));
  for (int64_t i = 0; i < n_q; ++i) {
    for (int32_t h = 0; h < kHeads; ++h) {
      const int32_t g = h / (kHeads / kKvHeads);
      std::vector<double> w;
      std::vector<int32_t> seen;
      double most = -1e300;
      for (const int32_t t : kept[g]) {
        if (t > q_pos[i]) continue;
        double dot = 0;
        for (int d = 0; d < kDim; ++d) {
          dot += double(q[(i * kHeads + h) * kDim + d]) * all.k[(t * kKvHeads + g) * kDim + d];
        }
        w.push_back(dot * scale);
        seen.push_back(t);
        most = std::max(most, w.back());
      }
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - most));
      for (size_t j = 0; j < seen.size(); ++j) {
        for (int d = 0; d < kDim; ++d) {
          out[(i * kHeads + h) * kDim + d] +=
              static_cast<float>(w[j] / sum * all.v[(seen[j] * kKvHeads + g) * kDim + d]);
        }
      }
    }
  }
  return out;
}

std::vector<float> attend(const LayerKv& store, const std::vector<float>& q,
                          std::vector<int32_t> q_pos) {
  std::vector<float> out(q.size());
  store.attend(AttentionQuery{q.data(), q_pos.data(), out.data(),
                              static_cast<int32_t>(q_pos.size()), kHeads,
                              1.f / std::sqrt(static_cast<float>(kDim))},
               nullptr);
  return out;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-5));
}

}  // namespace

TEST_CASE("a ragged layer attends as a dense one with each head's dropped slots masked, and "
          "holds only what each head keeps",
          "[unit][adakv]") {
  std::mt19937 rng(7);
  const KvShape shape{1, kKvHeads, kDim};
  const testing::Chunk all = testing::random_chunk(12, shape, kHeads, rng);
  DenseLayerKv store(kKvHeads, kDim);
  std::vector<int32_t> positions(10);
  std::iota(positions.begin(), positions.end(), 0);
  store.append(all.k.data(), all.v.data(), positions.data(), 10);

  std::vector<std::vector<int32_t>> kept = {{0, 3, 5, 9}, {1, 2, 3, 4, 6, 7, 8}};
  RetainPlan plan = ragged_plan(kept);
  store.retain(plan);
  CHECK(store.ragged());
  CHECK(store.head_tokens(0) == 4);
  CHECK(store.head_tokens(1) == 7);
  CHECK(store.n_tokens() == 7);
  CHECK(store.bytes_resident() == 11 * kTokenBytes);  // 4 + 7 rows, no rectangle of 2 x 7
  const DenseKv shape_only = store.view();
  CHECK(shape_only.k == nullptr);
  CHECK(shape_only.positions == nullptr);
  CHECK(shape_only.n_tokens == 7);

  // Two queries past the context, and one inside it (causality within a head's kept slots).
  const testing::Chunk q = testing::random_chunk(3, shape, kHeads, rng);
  check_close(attend(store, q.q, {10, 11, 4}), masked_reference(all, q.q, {10, 11, 4}, kept));

  // Two more tokens go to every head; each grows by its own slack.
  const int32_t next[2] = {10, 11};
  store.append(all.k.data() + 10 * kKvHeads * kDim, all.v.data() + 10 * kKvHeads * kDim, next, 2);
  for (auto& head : kept) head.insert(head.end(), {10, 11});
  CHECK(store.head_tokens(0) == 6);
  CHECK(store.head_tokens(1) == 9);
  check_close(attend(store, q.q, {11, 11, 11}), masked_reference(all, q.q, {11, 11, 11}, kept));

  // A clone is a deep copy; a second plan applies per head.
  const std::unique_ptr<LayerKv> copy = store.clone();
  // Slot indices now: head 0 holds positions {0, 3, 5, 9, 10, 11} in slots 0-5, head 1
  // {1, 2, 3, 4, 6, 7, 8, 10, 11} in slots 0-8.
  RetainPlan again = ragged_plan({{1, 5}, {0, 8}});
  store.retain(again);
  check_close(attend(store, q.q, {11, 11, 11}),
              masked_reference(all, q.q, {11, 11, 11}, {{3, 11}, {1, 11}}));
  CHECK(store.bytes_resident() == 4 * kTokenBytes);
  check_close(attend(*copy, q.q, {11, 11, 11}), masked_reference(all, q.q, {11, 11, 11}, kept));
  CHECK(copy->bytes_resident() >= 15 * kTokenBytes);
}

TEST_CASE("a rectangular plan keeps the one buffer: equal heads attend as before", "[unit][adakv]") {
  std::mt19937 rng(8);
  const KvShape shape{1, kKvHeads, kDim};
  const testing::Chunk all = testing::random_chunk(10, shape, kHeads, rng);
  std::vector<int32_t> positions(10);
  std::iota(positions.begin(), positions.end(), 0);
  DenseLayerKv ragged(kKvHeads, kDim), equal(kKvHeads, kDim);
  for (DenseLayerKv* s : {&ragged, &equal}) {
    s->append(all.k.data(), all.v.data(), positions.data(), 10);
  }
  RetainPlan as_ragged = ragged_plan({{0, 2, 4}, {1, 3, 5}});
  RetainPlan as_rect = as_ragged;
  as_rect.head_keep.clear();
  ragged.retain(as_ragged);
  equal.retain(as_rect);
  CHECK(ragged.ragged());
  CHECK(!equal.ragged());
  const testing::Chunk q = testing::random_chunk(2, shape, kHeads, rng);
  check_close(attend(ragged, q.q, {10, 10}), attend(equal, q.q, {10, 10}));
  CHECK(ragged.bytes_resident() == equal.bytes_resident());
}

TEST_CASE("adakv splits a layer's budget by the scores of all its heads, above a floor",
          "[unit][adakv]") {
  const ResolvedSpec spec = resolve_method_spec("adakv:floor=0.25+snapkv");
  std::shared_ptr<const HeadAllocation> rule = nullptr;
  for (const auto& [info, params] : spec.components) {
    if (info->kind == MethodKind::Allocation) rule = info->make_allocation(params);
  }
  REQUIRE(rule);
  // Head 0's eight scores all beat head 1's: the layer's top 2 x 4 are all head 0's, so it
  // keeps 8 x 0.75 + floor(4 x 0.25) = 7 and head 1 its floor, 1.
  std::vector<float> scores = {10, 11, 12, 13, 14, 15, 16, 17, 0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(rule->head_counts(scores.data(), 8, 2, 8, 4) == std::vector<int64_t>{7, 1});
  // Interleaved scores: four each, an even split.
  scores = {8, 1, 9, 3, 10, 5, 11, 7, 0, 12, 2, 13, 4, 14, 6, 15};
  CHECK(rule->head_counts(scores.data(), 8, 2, 8, 4) == std::vector<int64_t>{4, 4});
  // Ties at the threshold go to the first head, then the first tokens; a stride skips
  // columns past n_tokens (SnapKV's window). Head 0 has 3 of the top 4 (5, 5, 5 tied with
  // head 1's), head 1 the 9: 3 x 0.75 and 1 x 0.75 with a floor of int(2 x 0.25) = 0, 3 tokens
  // in all (the authors' rounded-down floor leaves a token of the budget unused).
  scores = {5, 5, 5, 9, 5, 5, 9, 9};
  CHECK(rule->head_counts(scores.data(), 4, 2, 3, 2) == std::vector<int64_t>{2, 1});

  // Largest remainders: 6.6 and 3.4 make 7 and 3, never 11 tokens for a budget of 10.
  CHECK(round_counts({6.6, 3.4}) == std::vector<int64_t>{7, 3});
  CHECK(round_counts({2.5, 2.5, 1.0}) == std::vector<int64_t>{3, 2, 1});
}

TEST_CASE("adakv+snapkv: heads keep different counts, the layer its budget, bytes the sum",
          "[unit][adakv]") {
  std::mt19937 rng(3);
  const KvShape shape{2, kKvHeads, kDim};
  // KV head 0's queries all point along the first channel, where only three of its keys
  // (tokens 40, 80, 120) are large: its window attends to them and nearly nothing else.
  // Head 1's keys are small: its window's attention is spread over the whole prefix.
  testing::Chunk c = testing::random_chunk(200, shape, kHeads, rng);
  for (int64_t t = 0; t < c.n; ++t) {
    for (int d = 0; d < kDim; ++d) {
      c.k[(t * kKvHeads + 0) * kDim + d] = (d == 0 && t % 40 == 0 && t > 0 && t < 160) ? 12.f : 0.f;
      c.k[(t * kKvHeads + 1) * kDim + d] *= 0.05f;
    }
    for (int32_t h = 0; h < kHeads / kKvHeads; ++h) {  // the query heads of KV head 0
      for (int d = 0; d < kDim; ++d) c.q[(t * kHeads + h) * kDim + d] = d == 0 ? 1.f : 0.f;
    }
  }
  KvCache ada = make_cache("adakv+snapkv:budget=40,window=8", shape);
  KvCache even = make_cache("snapkv:budget=40,window=8", shape);
  for (KvCache* cache : {&ada, &even}) {
    testing::feed(*cache, kHeads, c);
    cache->end_context();
  }
  const CacheStats a = ada.stats(), e = even.stats();
  for (int32_t l = 0; l < 2; ++l) {
    const int64_t h0 = a.tokens_per_head[l * kKvHeads], h1 = a.tokens_per_head[l * kKvHeads + 1];
    CHECK(h0 + h1 <= 2 * 40);
    CHECK(h0 != h1);
    CHECK(std::min(h0, h1) >= 8 + static_cast<int64_t>(32 * 0.2));  // window + floor
    CHECK(e.tokens_per_head[l * kKvHeads] == 40);
  }
  // Bytes are the tokens each head holds, no more: at most the even split's.
  int64_t held = 0;
  for (const int64_t n : a.tokens_per_head) held += n;
  int64_t store = 0;
  for (int32_t l = 0; l < 2; ++l) store += ada.layer(l).bytes_resident();
  CHECK(store == held * kTokenBytes);
  CHECK(store <= 2 * 2 * 40 * kTokenBytes);
  // The spread head (1) is the one that gets more: head 0's top 2 x 32 holds its three hits
  // and their pooled neighbours (15), so it keeps about 0.8 x 15 + 6 + the window of 8.
  for (int32_t l = 0; l < 2; ++l) {
    CHECK(a.tokens_per_head[l * kKvHeads] <= 8 + 6 + 16);
    CHECK(a.tokens_per_head[l * kKvHeads + 1] > 2 * 40 - 8 - 6 - 16 - 8);
  }
  // Decoding goes on over the ragged heads, and a clone is independent.
  KvCache branch = ada.clone();
  testing::decode_step(branch, kHeads, testing::random_chunk(1, shape, kHeads, rng));
  CHECK(ada.stats().tokens_per_head == a.tokens_per_head);
  CHECK(branch.stats().tokens_per_head[0] == a.tokens_per_head[0] + 1);
}

TEST_CASE("adakv composes only in front of an eviction method that ranks per KV head",
          "[unit][adakv]") {
  CHECK(resolve_method_spec("adakv+snapkv:ratio=0.25").canonical ==
        "adakv:floor=0.2+snapkv:ratio=0.25,window=32,kernel=5,pool=avg");
  CHECK_NOTHROW(resolve_method_spec("adakv+pyramidkv:ratio=0.25"));
  CHECK_THROWS_WITH(resolve_method_spec("adakv"), Catch::Contains("give one after it"));
  CHECK_THROWS_WITH(resolve_method_spec("snapkv+adakv"), Catch::Contains("comes before"));
  CHECK_THROWS_WITH(resolve_method_spec("adakv+h2o"), Catch::Contains("takes none"));
  CHECK_NOTHROW(resolve_method_spec("adakv+snapkv+kivi"));  // tests/test_head_split.cpp
  CHECK_THROWS_WITH(resolve_method_spec("adakv+snapkv+mikv"), Catch::Contains("fp32 store"));
  CHECK_THROWS_AS(resolve_method_spec("adakv:floor=1.5+snapkv"), InputError);
  CHECK_THROWS_WITH(resolve_method_spec("adakv+adakv+snapkv"), Catch::Contains("at most one"));
}

TEST_CASE("a ragged layer shows each head alone, with the positions it kept", "[unit][adakv]") {
  std::mt19937 rng(9);
  const KvShape shape{1, kKvHeads, kDim};
  const testing::Chunk all = testing::random_chunk(10, shape, kHeads, rng);
  std::vector<int32_t> positions(10);
  std::iota(positions.begin(), positions.end(), 0);
  auto store = std::make_unique<DenseLayerKv>(kKvHeads, kDim);
  store->append(all.k.data(), all.v.data(), positions.data(), 10);
  RetainPlan plan = ragged_plan({{0, 3, 5, 9}, {1, 2, 3, 4, 6, 7, 8}});
  store->retain(plan);
  std::vector<std::unique_ptr<LayerKv>> layers;
  layers.push_back(std::move(store));
  const KvCache cache(shape, std::move(layers));
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{0, 3, 5, 9});
  CHECK(testing::kept(cache, 0, 1) == std::vector<int32_t>{1, 2, 3, 4, 6, 7, 8});
  CHECK(cache.stats().tokens_per_head == std::vector<int64_t>{4, 7});
  CHECK(cache.stats().tokens_per_layer == std::vector<int64_t>{6});  // 5.5, rounded up
}
