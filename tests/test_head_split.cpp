// Heads of their own in the narrow and KIVI stores (cache/head_split.h): after a ragged
// plan each KV head is a one-head store of the layer's kind. A narrow layer then attends as
// the fp32 ragged store over the same rounded rows; a KIVI layer holds each head exactly as
// a one-head KIVI store fed that head alone and given that head's plan would, bit for bit,
// through later appends, packing and plans; bytes are the sum over heads.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cache/full_cache.h"
#include "cache/head_split.h"
#include "cache/narrow_kv.h"
#include "cache/registry.h"
#include "harness/model_cache.h"  // check_runs_on
#include "kernels/cpu/narrow.h"
#include "methods/kivi.h"
#include "tests/cache_feed.h"
#include "tests/retain_plans.h"

using namespace kvbench;
using kvbench::testing::ragged_plan;

namespace {

constexpr int32_t kKvHeads = 2, kHeads = 4, kGroup = kHeads / kKvHeads, kDim = 32;

std::vector<int32_t> range(int32_t from, int32_t n) {
  std::vector<int32_t> r(n);
  std::iota(r.begin(), r.end(), from);
  return r;
}

std::vector<float> attend(const LayerKv& store, const std::vector<float>& q,
                          std::vector<int32_t> q_pos, int32_t n_heads = kHeads) {
  std::vector<float> out(q.size());
  store.attend(AttentionQuery{q.data(), q_pos.data(), out.data(),
                              static_cast<int32_t>(q_pos.size()), n_heads,
                              1.f / std::sqrt(static_cast<float>(kDim))},
               nullptr);
  return out;
}

// Rows of KV head (or query-head group) h out of rows interleaved by head.
std::vector<float> head_rows(const std::vector<float>& rows, int32_t n_heads, int32_t first,
                             int32_t count) {
  const int64_t n = static_cast<int64_t>(rows.size()) / (n_heads * kDim);
  std::vector<float> out;
  for (int64_t i = 0; i < n; ++i) {
    const auto at = rows.begin() + (i * n_heads + first) * kDim;
    out.insert(out.end(), at, at + count * kDim);
  }
  return out;
}

// Every 3rd slot in head 0, every odd one in head 1: 100 and 150 of 300 (both sized to
// their counts: a store keeps its capacity only when a plan drops a few slots).
std::vector<std::vector<int32_t>> uneven_keep(int32_t n) {
  std::vector<std::vector<int32_t>> kept(kKvHeads);
  for (int32_t t = 0; t < n; ++t) {
    if (t % 3 == 0) kept[0].push_back(t);
    if (t % 2 == 1) kept[1].push_back(t);
  }
  return kept;
}

// The rows a store holds in the projection layout ([n, n_kv_heads, dim]) from its fp32 view.
void interleave(const DenseKv& kv, std::vector<float>& k, std::vector<float>& v) {
  k.assign(kv.n_tokens * kv.n_kv_heads * kDim, 0.f);
  v.assign(k.size(), 0.f);
  for (int64_t t = 0; t < kv.n_tokens; ++t) {
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      const int64_t from = (h * kv.capacity + t) * kDim, to = (t * kv.n_kv_heads + h) * kDim;
      std::copy_n(kv.k + from, kDim, &k[to]);
      std::copy_n(kv.v + from, kDim, &v[to]);
    }
  }
}

void check_close(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-5));
}

}  // namespace

TEST_CASE("a narrow layer with heads of their own attends as the fp32 ragged store over its "
          "rounded rows, and holds only what each head keeps",
          "[unit][head_split]") {
  const auto element = GENERATE(KvElement::F16, KvElement::BF16, KvElement::F8E4M3);
  std::mt19937 rng(11);
  const KvShape shape{1, kKvHeads, kDim};
  const testing::Chunk all = testing::random_chunk(302, shape, kHeads, rng);
  HeadSplitLayerKv store(std::make_unique<NarrowLayerKv>(kKvHeads, kDim, element), kKvHeads,
                         kDim);
  const std::vector<int32_t> positions = range(0, 300);
  store.append(all.k.data(), all.v.data(), positions.data(), 300);
  // The fp32 store given exactly the rounded rows.
  std::vector<float> rounded_k, rounded_v;
  interleave(store.view(), rounded_k, rounded_v);
  DenseLayerKv dense(kKvHeads, kDim);
  dense.append(rounded_k.data(), rounded_v.data(), positions.data(), 300);
  const int64_t whole_bytes = store.bytes_resident();

  const std::vector<std::vector<int32_t>> kept = uneven_keep(300);
  RetainPlan plan = ragged_plan(kept), same = ragged_plan(kept);
  store.retain(plan);
  dense.retain(same);
  REQUIRE(store.split());
  CHECK(store.head_tokens(0) == 100);
  CHECK(store.head_tokens(1) == 150);
  CHECK(store.n_tokens() == 150);
  CHECK(store.view().k == nullptr);
  const int64_t row = 2 * narrow_row_bytes(element, kDim) + sizeof(int32_t);
  CHECK(store.bytes_resident() == 250 * row);  // each head sized to its count
  CHECK(store.bytes_resident() * 600 == whole_bytes * 250);

  const testing::Chunk q = testing::random_chunk(3, shape, kHeads, rng);
  check_close(attend(store, q.q, {300, 301, 150}), attend(dense, q.q, {300, 301, 150}));

  // Two more tokens in every head (rounded as stored), then a later plan per head.
  const int64_t kv_row = kKvHeads * kDim;
  store.append(all.k.data() + 300 * kv_row, all.v.data() + 300 * kv_row, &range(300, 2)[0], 2);
  const DenseKv head0 = dynamic_cast<const NarrowLayerKv&>(store.head(0)).view();
  const DenseKv head1 = dynamic_cast<const NarrowLayerKv&>(store.head(1)).view();
  std::vector<float> next_k(2 * kv_row), next_v(next_k.size());
  for (int32_t t = 0; t < 2; ++t) {
    std::copy_n(head0.k + (100 + t) * kDim, kDim, &next_k[(t * kKvHeads) * kDim]);
    std::copy_n(head1.k + (150 + t) * kDim, kDim, &next_k[(t * kKvHeads + 1) * kDim]);
    std::copy_n(head0.v + (100 + t) * kDim, kDim, &next_v[(t * kKvHeads) * kDim]);
    std::copy_n(head1.v + (150 + t) * kDim, kDim, &next_v[(t * kKvHeads + 1) * kDim]);
  }
  dense.append(next_k.data(), next_v.data(), &range(300, 2)[0], 2);
  check_close(attend(store, q.q, {301, 301, 301}), attend(dense, q.q, {301, 301, 301}));

  // Slots move as each store places them, so the later plan is made by position.
  const std::unique_ptr<LayerKv> copy = store.clone();
  const std::vector<std::vector<int32_t>> keep_positions = {
      {0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 300, 301}, {1, 3, 301}};
  const auto plan_by_position = [&](const std::vector<DenseKv>& heads) {
    std::vector<std::vector<int32_t>> slots(kKvHeads);
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int32_t t = 0; t < heads[h].n_tokens; ++t) {
        const int32_t p = heads[h].positions[t];
        const auto& keep = keep_positions[h];
        if (std::count(keep.begin(), keep.end(), p)) slots[h].push_back(t);
      }
    }
    return ragged_plan(slots);
  };
  RetainPlan again = plan_by_position({dynamic_cast<const NarrowLayerKv&>(store.head(0)).view(),
                                       dynamic_cast<const NarrowLayerKv&>(store.head(1)).view()});
  RetainPlan again_dense = plan_by_position({dense.head_view(0), dense.head_view(1)});
  store.retain(again);
  dense.retain(again_dense);
  CHECK(store.head_tokens(0) == 12);
  CHECK(store.head_tokens(1) == 3);
  check_close(attend(store, q.q, {301, 301, 301}), attend(dense, q.q, {301, 301, 301}));
  CHECK(store.bytes_resident() == 15 * row);
  CHECK(copy->head_tokens(1) == 152);  // the clone is its own
}

TEST_CASE("a KIVI layer with heads of their own holds each head as a one-head KIVI store fed "
          "that head alone, bit for bit",
          "[unit][head_split]") {
  const auto tail = GENERATE(KiviTail::Kivi, KiviTail::Block);
  KiviConfig config;
  config.bits = 2;
  config.residual = 32;
  config.tail = tail;
  std::mt19937 rng(5);
  const KvShape shape{1, kKvHeads, kDim};
  const testing::Chunk all = testing::random_chunk(400, shape, kHeads, rng);
  HeadSplitLayerKv store(std::make_unique<KiviLayerKv>(kKvHeads, kDim, config), kKvHeads, kDim);
  std::vector<std::unique_ptr<KiviLayerKv>> alone;
  for (int32_t h = 0; h < kKvHeads; ++h) {
    alone.push_back(std::make_unique<KiviLayerKv>(1, kDim, config));
  }
  const auto append = [&](int32_t from, int32_t n) {
    const int64_t kv_row = kKvHeads * kDim;
    const std::vector<int32_t> positions = range(from, n);
    std::vector<float> k(all.k.begin() + from * kv_row, all.k.begin() + (from + n) * kv_row);
    std::vector<float> v(all.v.begin() + from * kv_row, all.v.begin() + (from + n) * kv_row);
    store.append(k.data(), v.data(), positions.data(), n);
    for (int32_t h = 0; h < kKvHeads; ++h) {
      const std::vector<float> hk = head_rows(k, kKvHeads, h, 1), hv = head_rows(v, kKvHeads, h, 1);
      alone[h]->append(hk.data(), hv.data(), positions.data(), n);
    }
  };
  const auto settle = [&] {
    store.settle();
    for (auto& one : alone) one->settle();
  };
  const testing::Chunk q = testing::random_chunk(2, shape, kHeads, rng);
  const auto check_heads = [&](std::vector<int32_t> q_pos) {
    const std::vector<float> got = attend(store, q.q, q_pos);
    int64_t bytes = 0;
    for (int32_t h = 0; h < kKvHeads; ++h) {
      const std::vector<float> group_q = head_rows(q.q, kHeads, h * kGroup, kGroup);
      const std::vector<float> want = attend(*alone[h], group_q, q_pos, kGroup);
      CHECK(head_rows(got, kHeads, h * kGroup, kGroup) == want);
      CHECK(store.head_tokens(h) == alone[h]->n_tokens());
      bytes += alone[h]->bytes_resident();
    }
    CHECK(store.bytes_resident() == bytes);
  };

  // The context, packed, then a ragged plan that cuts into the packed blocks.
  append(0, 300);
  settle();
  REQUIRE(dynamic_cast<const KiviLayerKv&>(store.whole()).n_blocks() > 0);
  const std::vector<std::vector<int32_t>> kept = uneven_keep(300);
  RetainPlan plan = ragged_plan(kept);
  store.retain(plan);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    RetainPlan one;
    one.n_keep = static_cast<int64_t>(kept[h].size());
    one.slots = kept[h];
    alone[h]->retain(one);
    CHECK(std::vector<int32_t>(plan.slots.begin() + (h == 0 ? 0 : 100),
                               plan.slots.begin() + (h == 0 ? 100 : 250)) == one.slots);
  }
  settle();
  REQUIRE(store.split());
  CHECK(store.head_tokens(0) == 100);
  CHECK(store.head_tokens(1) == 150);
  check_heads({300, 301});

  // Decode on: each head packs its own blocks when its own tail fills.
  for (int32_t t = 300; t < 400; ++t) {
    append(t, 1);
    settle();
  }
  CHECK(dynamic_cast<const KiviLayerKv&>(store.head(0)).n_blocks() !=
        dynamic_cast<const KiviLayerKv&>(store.head(1)).n_blocks());
  check_heads({399, 399});

  // A clone is its own; a later plan applies per head.
  const std::unique_ptr<LayerKv> copy = store.clone();
  RetainPlan again = ragged_plan({range(0, 50), range(100, 90)});
  store.retain(again);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    RetainPlan one;
    one.n_keep = h == 0 ? 50 : 90;
    one.slots = h == 0 ? range(0, 50) : range(100, 90);
    alone[h]->retain(one);
  }
  settle();
  check_heads({399, 399});
  CHECK(copy->head_tokens(0) == 200);
}

TEST_CASE("heads of their own compose in front of the storage methods that split their heads",
          "[unit][head_split]") {
  CHECK_NOTHROW(resolve_method_spec("adakv+snapkv:ratio=0.25+kivi"));
  CHECK_NOTHROW(resolve_method_spec("adakv+snapkv:ratio=0.25+fp8"));
  CHECK_NOTHROW(resolve_method_spec("duo_attention:ratio=0.5+bf16"));
  CHECK_THROWS_WITH(resolve_method_spec("adakv+snapkv:ratio=0.25+mikv"),
                    Catch::Contains("only the fp32 store and"));
  // The device's narrow and KIVI stores split their heads too (tests/test_cuda_kivi_store.cpp).
  CHECK_NOTHROW(check_runs_on(resolve_method_spec("adakv+snapkv+kivi"), ModelDevice::Cuda));
  CHECK_NOTHROW(
      check_runs_on(resolve_method_spec("duo_attention:ratio=0.5+fp8"), ModelDevice::Cuda));

  // Through a cache: adakv+snapkv+kivi keeps per head exactly what adakv+snapkv keeps (its
  // plan is made on the fp32 context, before anything is packed), in KIVI's bytes.
  std::mt19937 rng(3);
  const KvShape shape{2, kKvHeads, kDim};
  const testing::Chunk context = testing::random_chunk(1024, shape, kHeads, rng);
  KvCache fp32 = make_cache("adakv+snapkv:ratio=0.25,window=8", shape);
  KvCache packed = make_cache("adakv+snapkv:ratio=0.25,window=8+kivi:residual=32", shape);
  for (KvCache* cache : {&fp32, &packed}) {
    testing::feed(*cache, kHeads, context);
    cache->end_context();
  }
  const CacheStats a = fp32.stats(), b = packed.stats();
  CHECK(a.tokens_per_head == b.tokens_per_head);
  CHECK(a.tokens_per_head[0] != a.tokens_per_head[1]);
  CHECK(b.bytes_resident * 2 < a.bytes_resident);
  REQUIRE(dynamic_cast<const HeadSplitLayerKv*>(&packed.layer(0)) != nullptr);
  CHECK(dynamic_cast<const HeadSplitLayerKv&>(packed.layer(0)).split());
}
