// kvquant_keys (methods/kvquant_keys.*, kernels/cpu/kvquant.*): keys back before RoPE within
// half a step of their channel's range, outliers and the sink as fp16 holds them, values
// within half a step of their row's; attention over the store bit for bit attention over its
// decoded rows (and near the reference); bytes exact; after snapkv and h2o; merged rows;
// clones independent.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kvquant.h"
#include "kernels/cpu/layer_ops.h"
#include "methods/kvquant_keys.h"
#include "tests/cache_feed.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;
constexpr int32_t kQueryHeads = 4;

// Qwen2.5's RoPE: theta 1e6.
std::vector<float> rope_freqs(int32_t head_dim) {
  std::vector<float> f(head_dim / 2);
  for (int32_t i = 0; i < head_dim / 2; ++i) {
    f[i] = static_cast<float>(std::pow(1e6, -2.0 * i / head_dim));
  }
  return f;
}

KvShape shape_of(int32_t n_layers, int32_t head_dim) {
  return KvShape{n_layers, kHeads, head_dim, rope_freqs(head_dim)};
}

std::shared_ptr<const std::vector<double>> rope_table(int32_t head_dim) {
  const std::vector<float> f = rope_freqs(head_dim);
  auto t = std::make_shared<std::vector<double>>(rope_angle_table_size(head_dim / 2));
  fill_rope_angles(f.data(), head_dim / 2, t->data());
  return t;
}

// Tokens as a model hands them: keys with a per-channel offset and spread before RoPE (what
// makes per-channel quantization pay), a few large values, then rotated to their positions.
struct Tokens {
  int64_t n;
  int32_t dim;
  std::vector<float> before, k, v;  // [n, kHeads, dim]
  std::vector<int32_t> positions;

  Tokens(int64_t n_, int32_t dim_, uint32_t seed, int32_t first = 0) : n(n_), dim(dim_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> offset(kHeads * dim), spread(kHeads * dim);
    std::mt19937 channels(7);  // the same channels in every call: one model
    for (float& x : offset) x = 4.f * normal(channels);
    for (float& x : spread) x = 0.2f + std::fabs(normal(channels));
    before.resize(n * kHeads * dim);
    v.resize(before.size());
    for (int64_t i = 0; i < static_cast<int64_t>(before.size()); ++i) {
      const int64_t c = i % (kHeads * dim);
      before[i] = offset[c] + spread[c] * normal(rng);
      if (rng() % 500 == 0) before[i] += 40.f * normal(rng);  // an outlier
      v[i] = normal(rng);
    }
    positions.resize(n);
    for (int64_t t = 0; t < n; ++t) positions[t] = first + static_cast<int32_t>(t);
    k = before;
    const std::vector<float> f = rope_freqs(dim);
    rope_interleaved_cpu(k.data(), positions.data(), n, kHeads, dim, f.data());
  }
  const float* key_before(int64_t t, int32_t h) const { return &before[(t * kHeads + h) * dim]; }
  const float* value(int64_t t, int32_t h) const { return &v[(t * kHeads + h) * dim]; }
};

float fp16_error(float x) { return std::fabs(x) * (1.f / 2048) + 1e-7f; }

// A query chunk at `first`.. and its output buffer.
struct Queries {
  std::vector<float> q, out;
  std::vector<int32_t> positions;
  Queries(int32_t n, int32_t dim, int32_t first, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    q.resize(static_cast<size_t>(n) * kQueryHeads * dim);
    for (float& x : q) x = normal(rng);
    out.assign(q.size(), 0.f);
    for (int32_t i = 0; i < n; ++i) positions.push_back(first + i);
  }
  AttentionQuery query(int32_t dim) {
    return AttentionQuery{q.data(), positions.data(), out.data(),
                          static_cast<int32_t>(positions.size()), kQueryHeads,
                          1.f / std::sqrt(static_cast<float>(dim))};
  }
};

}  // namespace

TEST_CASE("kvquant rotate_rows is the model's RoPE and takes it back", "[unit]") {
  const int32_t dim = 64;
  const std::vector<float> f = rope_freqs(dim);
  const auto table = rope_table(dim);
  const RopeAngles rope{table->data(), dim / 2};
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 3.f);
  const std::vector<int32_t> positions = {0, 1, 255, 256, 65535, 65536, 70001, 1 << 23};
  std::vector<float> x(positions.size() * dim);
  for (float& e : x) e = normal(rng);
  std::vector<float> model = x, ours = x;
  rope_interleaved_cpu(model.data(), positions.data(), positions.size(), 1, dim, f.data());
  rotate_rows(rope, ours.data(), dim, positions.data(), positions.size(), 1);
  for (size_t i = 0; i < x.size(); ++i) CHECK(ours[i] == Approx(model[i]).margin(1e-5));
  rotate_rows(rope, ours.data(), dim, positions.data(), positions.size(), -1);
  for (size_t i = 0; i < x.size(); ++i) CHECK(ours[i] == Approx(x[i]).margin(1e-5));
}

TEST_CASE("kvquant_keys round trip: keys before RoPE per channel, values per token, outliers "
          "and the sink in fp16",
          "[unit]") {
  const int32_t dim = GENERATE(32, 64);
  const int32_t bits = GENERATE(2, 3, 4);
  INFO("head_dim " << dim << ", bits " << bits);
  const int64_t n = 200;
  const Tokens tokens(n, dim, 11);
  KvQuantConfig config;
  config.bits = bits;
  KvQuantLayerKv store(kHeads, dim, config, rope_table(dim));
  store.append(tokens.k.data(), tokens.v.data(), tokens.positions.data(), n);
  CHECK(!store.fitted());
  store.settle();
  REQUIRE(store.fitted());
  // A later chunk, quantized as it comes against the context's ranges.
  const Tokens later(40, dim, 12, static_cast<int32_t>(n));
  store.append(later.k.data(), later.v.data(), later.positions.data(), later.n);
  REQUIRE(store.n_tokens() == n + later.n);

  const DenseKv got = store.view();
  const std::vector<float> f = rope_freqs(dim);
  const float levels = static_cast<float>((1 << bits) - 1);
  const int32_t side = static_cast<int32_t>(std::ceil(0.005 * (dim - 1)));
  int64_t key_outliers = 0;
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int64_t s = 0; s < got.n_tokens; ++s) {
      const int32_t p = got.positions[h * got.capacity + s];
      const Tokens& from = p < n ? tokens : later;
      const int64_t t = p < n ? p : p - n;
      REQUIRE(p == (p < n ? tokens.positions[t] : later.positions[t]));
      // The decoded key turned back before RoPE, against the original.
      std::vector<float> key(got.k + (h * got.capacity + s) * dim,
                             got.k + (h * got.capacity + s + 1) * dim);
      const int32_t back = -p;
      rope_interleaved_cpu(key.data(), &back, 1, 1, dim, f.data());
      const float* want_k = from.key_before(t, h);
      const float* want_v = from.value(t, h);
      const float* got_v = got.v + (h * got.capacity + s) * dim;
      const float slack = 2e-5f * (1.f + std::fabs(want_k[0]));  // two rotations' rounding
      if (p == 0) {  // the sink, whole in fp16
        for (int32_t c = 0; c < dim; ++c) {
          CHECK(std::fabs(key[c] - want_k[c]) <= fp16_error(want_k[c]) + 1e-4f);
          CHECK(std::fabs(got_v[c] - want_v[c]) <= fp16_error(want_v[c]));
        }
        continue;
      }
      for (int32_t c = 0; c < dim; ++c) {
        const float lo = store.key_min()[h * dim + c], hi = store.key_max()[h * dim + c];
        const bool apart = want_k[c] < lo || want_k[c] > hi;
        key_outliers += apart;
        const float bound = apart ? fp16_error(want_k[c]) : (hi - lo) / levels / 2;
        CHECK(std::fabs(key[c] - want_k[c]) <= bound + slack + 1e-4f);
      }
      // Values: the `side` smallest and largest kept apart, the rest within half a step.
      std::vector<float> sorted(want_v, want_v + dim);
      std::sort(sorted.begin(), sorted.end());
      const float lo = sorted[side], hi = sorted[dim - 1 - side];
      for (int32_t c = 0; c < dim; ++c) {
        const bool apart = want_v[c] < lo || want_v[c] > hi;
        const float bound = apart ? fp16_error(want_v[c]) : (hi - lo) / levels / 2 + 1e-6f;
        CHECK(std::fabs(got_v[c] - want_v[c]) <= bound);
      }
    }
  }
  // About 1% of the context's key values fall outside their channel's percentiles.
  const double share = static_cast<double>(key_outliers) / (kHeads * (n + later.n - 1) * dim);
  CHECK(share > 0.002);
  CHECK(share < 0.05);
}

TEST_CASE("kvquant_keys attention equals attention over its decoded rows", "[unit]") {
  const int32_t dim = GENERATE(32, 64);
  const int64_t n = GENERATE(17, 150, 333);
  const int32_t bits = GENERATE(2, 4);
  INFO("head_dim " << dim << ", tokens " << n << ", bits " << bits);
  const Tokens tokens(n, dim, 21);
  KvQuantConfig config;
  config.bits = bits;
  KvQuantLayerKv store(kHeads, dim, config, rope_table(dim));
  store.append(tokens.k.data(), tokens.v.data(), tokens.positions.data(), n);
  store.settle();
  REQUIRE(store.fitted());
  const Tokens next(3, dim, 22, static_cast<int32_t>(n));
  store.append(next.k.data(), next.v.data(), next.positions.data(), 3);

  for (const int32_t n_queries : {1, 3}) {
    Queries got(n_queries, dim, static_cast<int32_t>(n + 3 - n_queries), 23);
    Queries want = got, reference = got;
    const int64_t read = store.attend(got.query(dim), nullptr);
    attention_dense_cpu(want.query(dim), store.view());
    CHECK(got.out == want.out);  // bit for bit: the same tiles, decoded
    std::vector<SparseRows> heads;
    attention_kvquant_reference(reference.query(dim), store.layout(heads), nullptr);
    for (size_t i = 0; i < got.out.size(); ++i) {
      CHECK(got.out[i] == Approx(reference.out[i]).margin(1e-4));
    }
    CHECK(read > kHeads * (n + 3) * kvquant_slot_bytes(dim, bits));
  }
  // Over selected pages (Quest in front).
  const int32_t pages[] = {0, 2, 0, 1};  // [kHeads, 2] pages of 8 slots
  const PageSelection selection{pages, 2, 8};
  Queries got(1, dim, static_cast<int32_t>(n + 2), 24);
  Queries want = got;
  store.attend(got.query(dim), &selection);
  attention_pages_cpu(want.query(dim), store.view(), selection);
  CHECK(got.out == want.out);
}

TEST_CASE("kvquant_keys bytes are its codes, ranges and outlier rows, exactly", "[unit]") {
  const int32_t dim = 64, bits = 2;
  const int64_t n = 256;
  const Tokens tokens(n, dim, 31);
  KvQuantConfig config;
  config.bits = bits;
  KvQuantLayerKv store(kHeads, dim, config, rope_table(dim));
  DenseLayerKv dense(kHeads, dim);
  store.reserve(n);
  store.append(tokens.k.data(), tokens.v.data(), tokens.positions.data(), n);
  dense.reserve(n);
  dense.append(tokens.k.data(), tokens.v.data(), tokens.positions.data(), n);
  // Before the fit: the fp32 rows, as the dense store.
  CHECK(store.bytes_resident() == dense.bytes_resident());
  store.settle();
  std::vector<SparseRows> heads;
  const KvQuantKv kv = store.layout(heads);
  int64_t entries = 0;
  for (int32_t h = 0; h < kHeads; ++h) entries += heads[h].start[n];
  const int64_t codes = 2 * n * dim * bits / 8;  // keys and values, per head
  const int64_t per_token = 4 + 4 + 4;           // value scale and minimum, position
  const int64_t ranges = 3 * dim * 4;            // key minimum, maximum and scale
  const int64_t starts = (n + 1) * 4;            // each slot's start in the outlier rows
  const int64_t outlier = 2 + 2;                 // fp16 value, 16-bit channel
  CHECK(kv.capacity == n);
  CHECK(store.bytes_resident() ==
        kHeads * (codes + n * per_token + ranges + starts) + entries * outlier);
  // The sink's 2 x 64 values and about 1% + 3% of the rest.
  CHECK(entries > kHeads * 2 * dim);
  CHECK(entries < kHeads * (2 * dim + n * dim / 10));
  CHECK(store.bytes_resident() * 6 < dense.bytes_resident());
}

TEST_CASE("kvquant_keys composes after snapkv and h2o; clones are independent", "[unit]") {
  const KvShape shape = shape_of(2, 64);
  std::mt19937 rng(5);
  const Tokens context(200, 64, 41);
  testing::Chunk chunk;
  chunk.n = context.n;
  chunk.k = context.k;
  chunk.v = context.v;
  chunk.q = testing::random_chunk(context.n, shape, kQueryHeads, rng).q;

  const ResolvedSpec spec = resolve_method_spec("snapkv:ratio=0.25+kvquant_keys:bits=4");
  CHECK(spec.canonical.find("+kvquant_keys:bits=4,outliers=0.01,sink=1") != std::string::npos);
  KvCache snap = make_cache("snapkv:ratio=0.25", shape);
  KvCache quant = make_cache(spec, shape);
  KvCache full = make_full_cache(shape);
  for (KvCache* c : {&snap, &quant, &full}) {
    testing::feed(*c, kQueryHeads, chunk);
    c->end_context();
  }
  for (int32_t l = 0; l < shape.n_layers; ++l) {  // snapkv's choice, then quantized
    const auto& store = dynamic_cast<const KvQuantLayerKv&>(quant.layer(l));
    CHECK(store.fitted());
    const DenseKv a = snap.layer(l).view(), b = store.view();
    REQUIRE(a.n_tokens == 50);
    REQUIRE(b.n_tokens == 50);
    for (int32_t h = 0; h < kHeads; ++h) {
      const int32_t* pa = a.positions + h * a.capacity;
      const int32_t* pb = b.positions + h * b.capacity;
      CHECK(std::set<int32_t>(pa, pa + a.n_tokens) == std::set<int32_t>(pb, pb + b.n_tokens));
    }
  }
  CHECK(quant.stats().tokens_evicted == snap.stats().tokens_evicted);
  int64_t quant_bytes = 0, snap_bytes = 0;  // the stores alone: the policies are alike
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    quant_bytes += quant.layer(l).bytes_resident();
    snap_bytes += snap.layer(l).bytes_resident();
  }
  CHECK(quant_bytes * 4 < snap_bytes);
  // The next query reads about what snapkv's fp32 rows give.
  const testing::Chunk query = testing::random_chunk(1, shape, kQueryHeads, rng);
  const std::vector<float> from_snap = testing::decode_step(snap, kQueryHeads, query);
  const std::vector<float> from_quant = testing::decode_step(quant, kQueryHeads, query);
  double err = 0, size = 0;
  for (size_t i = 0; i < from_snap.size(); ++i) {
    err += std::fabs(from_quant[i] - from_snap[i]);
    size += std::fabs(from_snap[i]);
  }
  CHECK(err < 0.2 * size);

  // h2o evicts every decode step from the quantized store; a clone decodes on its own.
  KvCache h2o = make_cache("h2o:budget=48+kvquant_keys:bits=2", shape);
  testing::feed(h2o, kQueryHeads, chunk);
  h2o.end_context();
  const int64_t bytes = h2o.bytes_resident();
  const DenseKv before = h2o.layer(1).view();
  const std::vector<float> keys(before.k, before.k + kHeads * before.capacity * 64);
  KvCache branch = h2o.clone();
  for (int step = 0; step < 20; ++step) {
    testing::decode_step(branch, kQueryHeads, testing::random_chunk(1, shape, kQueryHeads, rng));
    REQUIRE(branch.layer(0).n_tokens() <= 48);
  }
  // After the evictions, attention still reads what the decoded rows hold.
  Queries got(1, 64, 220, 42);
  Queries want = got;
  branch.layer(1).attend(got.query(64), nullptr);
  attention_dense_cpu(want.query(64), branch.layer(1).view());
  CHECK(got.out == want.out);
  CHECK(h2o.bytes_resident() == bytes);
  CHECK(h2o.layer(0).n_tokens() == 48);
  const DenseKv after = h2o.layer(1).view();
  CHECK(std::vector<float>(after.k, after.k + kHeads * after.capacity * 64) == keys);
}

TEST_CASE("kvquant_keys encodes merged rows a plan brings after the fit", "[unit]") {
  const int32_t dim = 32;
  const Tokens tokens(64, dim, 51);
  KvQuantConfig config;
  config.bits = 4;
  KvQuantLayerKv store(kHeads, dim, config, rope_table(dim));
  store.append(tokens.k.data(), tokens.v.data(), tokens.positions.data(), tokens.n);
  store.settle();
  // Keep slots 0, 10, 20, 30 of each head; slot 20 takes slot 21's key and value (a merge).
  RetainPlan plan;
  plan.n_keep = 4;
  plan.slots = {0, 10, 20, 30, 0, 10, 20, 30};
  plan.k.resize(kHeads * 4 * dim);
  plan.v.resize(plan.k.size());
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t j = 0; j < 4; ++j) {
      const int64_t t = plan.slots[h * 4 + j];
      const int64_t src = j == 2 ? 21 : t;
      // Merged keys arrive at the destination's position (after RoPE there).
      std::vector<float> key(tokens.key_before(src, h), tokens.key_before(src, h) + dim);
      const std::vector<float> f = rope_freqs(dim);
      const int32_t p = static_cast<int32_t>(t);
      rope_interleaved_cpu(key.data(), &p, 1, 1, dim, f.data());
      std::copy(key.begin(), key.end(), &plan.k[(h * 4 + j) * dim]);
      std::copy_n(tokens.value(src, h), dim, &plan.v[(h * 4 + j) * dim]);
    }
  }
  store.retain(plan);
  REQUIRE(store.n_tokens() == 4);
  CHECK(plan.slots == std::vector<int32_t>{0, 10, 20, 30, 0, 10, 20, 30});
  const DenseKv got = store.view();
  const std::vector<float> f = rope_freqs(dim);
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t j = 1; j < 4; ++j) {  // slot 0 is the sink
      const int32_t p = got.positions[h * got.capacity + j];
      CHECK(p == 10 * j);
      const int64_t src = j == 2 ? 21 : p;
      std::vector<float> key(got.k + (h * got.capacity + j) * dim,
                             got.k + (h * got.capacity + j + 1) * dim);
      const int32_t back = -p;
      rope_interleaved_cpu(key.data(), &back, 1, 1, dim, f.data());
      for (int32_t c = 0; c < dim; ++c) {
        const float lo = store.key_min()[h * dim + c], hi = store.key_max()[h * dim + c];
        const float x = tokens.key_before(src, h)[c];
        const float bound = x < lo || x > hi ? fp16_error(x) : (hi - lo) / 15 / 2;
        CHECK(std::fabs(key[c] - x) <= bound + 1e-4f);
      }
    }
  }
}

TEST_CASE("kvquant_keys needs the model's RoPE and checks its parameters", "[unit]") {
  CHECK_THROWS_WITH(make_cache("kvquant_keys", KvShape{2, 2, 32}),
                    Catch::Contains("needs the model's RoPE"));
  CHECK_THROWS_AS(resolve_method_spec("kvquant_keys:bits=5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("kvquant_keys:outliers=0.6"), InputError);
  CHECK(resolve_method_spec("kvquant_keys").canonical ==
        "kvquant_keys:bits=3,outliers=0.01,sink=1");
  // A short context waits in fp32 for enough tokens to fit the ranges.
  const KvShape shape = shape_of(1, 32);
  std::mt19937 rng(9);
  KvCache cache = make_cache("kvquant_keys", shape);
  testing::feed(cache, kQueryHeads, testing::random_chunk(10, shape, kQueryHeads, rng));
  cache.end_context();
  CHECK(!dynamic_cast<const KvQuantLayerKv&>(cache.layer(0)).fitted());
  testing::feed(cache, kQueryHeads, testing::random_chunk(10, shape, kQueryHeads, rng));
  CHECK(dynamic_cast<const KvQuantLayerKv&>(cache.layer(0)).fitted());
}
