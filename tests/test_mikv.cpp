// MiKV's store (methods/mikv.*): what a plan drops is kept packed at low precision, what it
// keeps stays fp32; attention from the store equals attention over the dequantized rows;
// bytes exact; composed with eviction methods through the cache.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kivi_attention.h"
#include "methods/mikv.h"
#include "tests/cache_feed.h"
#include "tests/random_floats.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2, kDim = 64, kGroup = 32;

// n tokens of random K/V in the projection layout, positions 0..n-1.
struct Tokens {
  std::vector<float> k, v;
  std::vector<int32_t> positions;
  explicit Tokens(int64_t n, uint32_t seed)
      : k(testing::random_floats(n * kHeads * kDim, seed)),
        v(testing::random_floats(k.size(), seed + 1)),
        positions(n) {
    for (int64_t t = 0; t < n; ++t) positions[t] = static_cast<int32_t>(t);
  }
  const float* key(int64_t t, int32_t h) const { return &k[(t * kHeads + h) * kDim]; }
  const float* value(int64_t t, int32_t h) const { return &v[(t * kHeads + h) * kDim]; }
};

// Head 0 keeps the even slots of [0, 2 * keep), head 1 the last `keep`.
RetainPlan plan_for(int64_t n_important, int64_t keep) {
  RetainPlan plan;
  plan.n_keep = keep;
  for (int64_t j = 0; j < keep; ++j) plan.slots.push_back(static_cast<int32_t>(2 * j));
  for (int64_t j = 0; j < keep; ++j) {
    plan.slots.push_back(static_cast<int32_t>(n_important - keep + j));
  }
  return plan;
}

// The store's rows dequantized: blocks unpacked (the reference unpacking), then the fp32
// rows, per head in KiviKv's slot order.
struct Unpacked {
  std::vector<float> k, v;
  std::vector<int32_t> positions;
  DenseKv kv{};
  explicit Unpacked(const KiviKv& s) {
    const int64_t total = s.n_blocks * s.group + s.tail.n_tokens;
    k.resize(kHeads * total * kDim);
    v.resize(k.size());
    positions.resize(kHeads * total);
    const int64_t code_bytes = int64_t{s.group} * kDim * s.bits / 8;
    for (int32_t h = 0; h < kHeads; ++h) {
      for (int64_t b = 0; b < s.n_blocks; ++b) {
        const int64_t unit = b * kHeads + h;
        const int64_t row = h * total + b * s.group;
        for (int64_t c = 0; c < kDim; ++c) {  // keys: channel c over the block's tokens
          for (int64_t t = 0; t < s.group; ++t) {
            const int64_t i = c * s.group + t;
            const int code =
                (s.k_codes[unit * code_bytes + i * s.bits / 8] >> (i % (8 / s.bits)) * s.bits) &
                ((1 << s.bits) - 1);
            k[(row + t) * kDim + c] = s.k_min[unit * kDim + c] + code * s.k_scale[unit * kDim + c];
          }
        }
        for (int64_t t = 0; t < s.group; ++t) {  // values: token t's channels in groups
          for (int64_t c = 0; c < kDim; ++c) {
            const int64_t i = t * kDim + c, g = (t * kDim + c) / s.group;
            const int code =
                (s.v_codes[unit * code_bytes + i * s.bits / 8] >> (i % (8 / s.bits)) * s.bits) &
                ((1 << s.bits) - 1);
            v[(row + t) * kDim + c] = s.v_min[unit * kDim + g] + code * s.v_scale[unit * kDim + g];
          }
          positions[row + t] = s.positions[unit * s.group + t];
        }
      }
      for (int64_t t = 0; t < s.tail.n_tokens; ++t) {
        const int64_t row = h * total + s.n_blocks * s.group + t;
        const int64_t from = h * s.tail.capacity + t;
        std::copy_n(s.tail.k + from * kDim, kDim, &k[row * kDim]);
        std::copy_n(s.tail.v + from * kDim, kDim, &v[row * kDim]);
        positions[row] = s.tail.positions[from];
      }
    }
    kv = DenseKv{k.data(), v.data(), positions.data(), kHeads, kDim, total, total};
  }
};

}  // namespace

TEST_CASE("mikv keeps the planned slots in fp32 and packs the rest within their bound", "[unit]") {
  const int64_t n = 200, keep = 40;  // 160 demoted per head: 5 blocks, none pending
  const Tokens tokens(n, 7);
  for (const int32_t bits : {2, 4}) {
    INFO("bits " << bits);
    MikvLayerKv store(kHeads, kDim, bits);
    store.append(tokens.k.data(), tokens.v.data(), tokens.positions.data(), n);
    RetainPlan plan = plan_for(n, keep);
    const RetainPlan planned = plan;
    store.retain(plan);
    CHECK(plan.slots == planned.slots);  // kept slots keep their order
    CHECK(store.n_tokens() == keep);
    CHECK(store.n_tokens_held() == n);
    CHECK(store.n_blocks() == 5);
    CHECK(store.n_pending() == 0);

    // The important set is the planned rows, bit for bit.
    const DenseKv view = store.view();
    for (int32_t h = 0; h < kHeads; ++h) {
      for (int64_t j = 0; j < keep; ++j) {
        const int32_t slot = planned.slots[h * keep + j];
        const float* row = view.k + (h * view.capacity + j) * kDim;
        CHECK(std::equal(row, row + kDim, tokens.key(slot, h)));
        CHECK(view.positions[h * view.capacity + j] == slot);
      }
    }

    // Every token is held once; a demoted one is within half a quantization step of its
    // values (the step of its group: (max - min) / (2^bits - 1)).
    const Unpacked all(store.layout());
    for (int32_t h = 0; h < kHeads; ++h) {
      std::set<int32_t> seen;
      for (int64_t r = 0; r < all.kv.n_tokens; ++r) {
        const int32_t p = all.positions[h * all.kv.capacity + r];
        REQUIRE(seen.insert(p).second);
        if (r >= store.n_blocks() * kGroup) continue;
        const int64_t block = r / kGroup;
        for (int64_t c = 0; c < kDim; ++c) {
          float lo = INFINITY, hi = -INFINITY;  // key channel c over the block's tokens
          for (int64_t t = block * kGroup; t < (block + 1) * kGroup; ++t) {
            const float x = tokens.key(all.positions[h * all.kv.capacity + t], h)[c];
            lo = std::min(lo, x);
            hi = std::max(hi, x);
          }
          const float step = (hi - lo) / ((1 << bits) - 1);
          CHECK(std::fabs(all.k[(h * all.kv.capacity + r) * kDim + c] - tokens.key(p, h)[c]) <=
                step / 2 + 1e-5f);
        }
        for (int64_t g = 0; g < kDim / kGroup; ++g) {
          const float* x = tokens.value(p, h) + g * kGroup;
          const float step = (*std::max_element(x, x + kGroup) - *std::min_element(x, x + kGroup)) /
                             ((1 << bits) - 1);
          for (int64_t c = 0; c < kGroup; ++c) {
            CHECK(std::fabs(all.v[(h * all.kv.capacity + r) * kDim + g * kGroup + c] - x[c]) <=
                  step / 2 + 1e-5f);
          }
        }
      }
      CHECK(seen.size() == static_cast<size_t>(n));
    }
  }
}

TEST_CASE("mikv attention equals attention over its dequantized rows", "[unit]") {
  const int64_t n = 150, keep = 50;  // 100 demoted: 3 blocks and 4 rows pending per head
  const Tokens tokens(n, 11);
  MikvLayerKv store(kHeads, kDim, 2);
  store.append(tokens.k.data(), tokens.v.data(), tokens.positions.data(), n);
  RetainPlan plan = plan_for(n, keep);
  store.retain(plan);
  REQUIRE(store.n_blocks() == 3);
  REQUIRE(store.n_pending() == 4);
  const Tokens next(3, 12);  // a chunk after the context: positions 150..152
  std::vector<int32_t> positions = {150, 151, 152};
  store.append(next.k.data(), next.v.data(), positions.data(), 3);

  const int32_t n_heads = 4;
  const std::vector<float> q = testing::random_floats(3 * n_heads * kDim, 13);
  std::vector<float> got(q.size()), want(q.size());
  const float scale = 1.f / std::sqrt(float{kDim});
  store.attend(AttentionQuery{q.data(), positions.data(), got.data(), 3, n_heads, scale}, nullptr);
  const Unpacked all(store.layout());
  attention_dense_reference(
      AttentionQuery{q.data(), positions.data(), want.data(), 3, n_heads, scale}, all.kv);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-4));
}

TEST_CASE("mikv bytes are its blocks and fp32 rows, exactly, and fall below the dense store",
          "[unit]") {
  const int64_t n = 256, keep = 64;  // 192 demoted per head: 6 blocks
  const Tokens tokens(n, 17);
  MikvLayerKv store(kHeads, kDim, 2);
  DenseLayerKv dense(kHeads, kDim);
  store.append(tokens.k.data(), tokens.v.data(), tokens.positions.data(), n);
  dense.append(tokens.k.data(), tokens.v.data(), tokens.positions.data(), n);
  RetainPlan plan = plan_for(n, keep);
  store.retain(plan);
  const int64_t blocks = 6 + 1;  // capacity: 6 plus an eighth (at least one) of slack
  const int64_t block_bytes = kivi_block_bytes(kDim, kGroup, 2) + kGroup * sizeof(int32_t);
  const int64_t rows = keep + 64;  // room for the next forward, as append grows it
  const int64_t row_bytes = 2 * kDim * sizeof(float) + sizeof(int32_t);
  CHECK(store.bytes_resident() == kHeads * (blocks * block_bytes + rows * row_bytes));
  CHECK(store.bytes_resident() < dense.bytes_resident());
}

TEST_CASE("mikv needs an eviction method in front and composes after any", "[unit]") {
  CHECK_THROWS_AS(resolve_method_spec("mikv"), InputError);
  CHECK_THROWS_WITH(resolve_method_spec("mikv:bits=4"),
                    Catch::Contains("eviction method in front"));
  CHECK(resolve_method_spec("snapkv:ratio=0.25+mikv").canonical.find("+mikv:bits=2") !=
        std::string::npos);

  // Through the cache: snapkv's choice is what stays fp32, the rest is still attended; an
  // h2o cache demotes one token per decode step and frees none.
  const KvShape shape{2, kHeads, kDim};
  const int32_t n_heads = 4;
  std::mt19937 rng(5);
  const testing::Chunk context = testing::random_chunk(160, shape, n_heads, rng);
  KvCache snap = make_cache("snapkv:budget=32,window=8", shape);
  KvCache mixed = make_cache("snapkv:budget=32,window=8+mikv:bits=4", shape);
  KvCache full = make_full_cache(shape);
  for (KvCache* c : {&snap, &mixed, &full}) {
    testing::feed(*c, n_heads, context);
    c->end_context();
  }
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    const DenseKv a = snap.layer(l).view(), b = mixed.layer(l).view();
    REQUIRE(a.n_tokens == b.n_tokens);
    for (int32_t h = 0; h < kHeads; ++h) {  // the same tokens (the dense store reorders)
      const int32_t* pa = a.positions + h * a.capacity;
      const int32_t* pb = b.positions + h * b.capacity;
      CHECK(std::set<int32_t>(pa, pa + a.n_tokens) == std::set<int32_t>(pb, pb + b.n_tokens));
    }
  }
  CHECK(mixed.stats().tokens_per_layer == std::vector<int64_t>{160, 160});
  CHECK(mixed.stats().tokens_evicted == 0);
  CHECK(snap.stats().tokens_evicted == 2 * (160 - 32));
  // Closer to the full cache than snapkv alone on the next query.
  const testing::Chunk query = testing::random_chunk(1, shape, n_heads, rng);
  const std::vector<float> want = testing::decode_step(full, n_heads, query);
  const std::vector<float> from_snap = testing::decode_step(snap, n_heads, query);
  const std::vector<float> from_mixed = testing::decode_step(mixed, n_heads, query);
  double err_snap = 0, err_mixed = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err_snap += std::fabs(from_snap[i] - want[i]);
    err_mixed += std::fabs(from_mixed[i] - want[i]);
  }
  CHECK(err_mixed < err_snap / 2);

  KvCache h2o = make_cache("h2o:budget=48+mikv", shape);
  testing::feed(h2o, n_heads, context);
  h2o.end_context();
  KvCache branch = h2o.clone();
  for (int step = 0; step < 40; ++step) {
    testing::decode_step(branch, n_heads, testing::random_chunk(1, shape, n_heads, rng));
  }
  CHECK(branch.layer(0).n_tokens() <= 48);
  CHECK(branch.layer(0).n_tokens_held() == 200);
  CHECK(branch.stats().tokens_evicted == 0);
  CHECK(h2o.layer(0).n_tokens_held() == 160);  // the original is untouched
}
