// ZipCache (methods/zipcache.*): the salient tokens of a hand-made context get the high
// bits; every value within half a quantization step; attention equals attention over the
// widened rows; bytes exact; later tokens quantized `gap` at a time; spec rules; clones.
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
#include "methods/zipcache.h"
#include "tests/cache_feed.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2, kDim = 32, kQueryHeads = 4;
const KvShape kShape{1, kHeads, kDim};

// A context of n tokens whose queries all point along channel 0, and whose keys point there
// too (strongly) for the tokens in `salient`, elsewhere for the rest.
testing::Chunk hand_made_context(int64_t n, const std::set<int64_t>& salient) {
  std::mt19937 rng(3);
  testing::Chunk c = testing::random_chunk(n, kShape, kQueryHeads, rng);
  for (float& x : c.q) x *= 0.01f;
  for (float& x : c.k) x *= 0.01f;
  for (int64_t t = 0; t < n; ++t) {
    for (int32_t h = 0; h < kQueryHeads; ++h) c.q[(t * kQueryHeads + h) * kDim] = 4.f;
    for (int32_t h = 0; h < kHeads; ++h) {
      c.k[(t * kHeads + h) * kDim] = salient.count(t) ? 3.f : -3.f;
    }
  }
  return c;
}

const ZipCacheLayerKv& store(const KvCache& cache) {
  return dynamic_cast<const ZipCacheLayerKv&>(cache.layer(0));
}

}  // namespace

TEST_CASE("zipcache gives the salient tokens the high bits", "[unit]") {
  const int64_t n = 100;  // low_ratio 0.4: the 40 least salient at 2 bits
  std::set<int64_t> salient;
  for (int64_t t = 5; t < n; t += 2) salient.insert(t);  // 48 tokens, early and late
  KvCache cache = make_cache("zipcache", kShape);
  testing::feed(cache, kQueryHeads, hand_made_context(n, salient));
  cache.end_context();
  const ZipCacheLayerKv& zip = store(cache);
  REQUIRE(zip.n_batches() == 1);
  CHECK(zip.n_tokens() == 0);
  CHECK(zip.n_tokens_held() == n);
  std::vector<float> k, v;
  std::vector<int32_t> positions;
  const DenseKv all = zip.widen(k, v, positions);
  for (int32_t h = 0; h < kHeads; ++h) {
    std::set<int32_t> low(positions.begin() + h * n + 60, positions.begin() + (h + 1) * n);
    CHECK(low.size() == 40);
    for (int32_t p : low) CHECK(salient.count(p) == 0);  // every salient token kept high
  }
  CHECK(all.n_tokens == n);
}

TEST_CASE("zipcache values round-trip within half a step; attention reads the widened rows",
          "[unit]") {
  std::mt19937 rng(9);
  const int64_t n = 90;
  const testing::Chunk context = testing::random_chunk(n, kShape, kQueryHeads, rng);
  KvCache cache = make_cache("zipcache", kShape);
  testing::feed(cache, kQueryHeads, context);
  cache.end_context();
  const ZipCacheLayerKv& zip = store(cache);
  std::vector<float> k, v;
  std::vector<int32_t> positions;
  zip.widen(k, v, positions);
  // Keys: within half the class's step on each channel, at most (max - min) / 30 (4 bits)
  // or / 6 (2 bits) over all tokens. Values: within half the row's step times the channel
  // scale.
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int64_t r = 0; r < n; ++r) {
      const int32_t t = positions[h * n + r];
      const int32_t levels = r < n - 36 ? 15 : 3;  // 36 = floor(0.4 * 90) at 2 bits
      for (int32_t c = 0; c < kDim; ++c) {
        float lo = INFINITY, hi = -INFINITY, vpeak = 0;
        for (int64_t s = 0; s < n; ++s) {
          lo = std::min(lo, context.k[(s * kHeads + h) * kDim + c]);
          hi = std::max(hi, context.k[(s * kHeads + h) * kDim + c]);
          vpeak = std::max(vpeak, std::fabs(context.v[(s * kHeads + h) * kDim + c]));
        }
        CHECK(std::fabs(k[(h * n + r) * kDim + c] - context.k[(t * kHeads + h) * kDim + c]) <=
              (hi - lo) / levels / 2 + 1e-5f);
        // A row's step over channels divided by sqrt(peak) is at most 2 sqrt(max peak) / levels.
        float row_span = 0;
        for (int32_t j = 0; j < kDim; ++j) {
          float peak_j = 0;
          for (int64_t s = 0; s < n; ++s) {
            peak_j = std::max(peak_j, std::fabs(context.v[(s * kHeads + h) * kDim + j]));
          }
          row_span = std::max(row_span, 2 * std::sqrt(peak_j));
        }
        CHECK(std::fabs(v[(h * n + r) * kDim + c] - context.v[(t * kHeads + h) * kDim + c]) <=
              row_span / levels / 2 * std::sqrt(vpeak) + 1e-5f);
      }
    }
  }
  // A question after the context: the store's attention equals the reference over the rows.
  const testing::Chunk q = testing::random_chunk(3, kShape, kQueryHeads, rng);
  KvCache branch = cache.clone();
  const std::vector<float> got = testing::feed(branch, kQueryHeads, q);
  // The reference sees what the store held during that forward: the batch and the question.
  std::vector<float> k2, v2;
  std::vector<int32_t> p2;
  const DenseKv held = store(branch).widen(k2, v2, p2);
  REQUIRE(held.n_tokens == n + 3);
  std::vector<int32_t> qpos = {static_cast<int32_t>(n), static_cast<int32_t>(n + 1),
                               static_cast<int32_t>(n + 2)};
  std::vector<float> want(got.size());
  attention_dense_reference(AttentionQuery{q.q.data(), qpos.data(), want.data(), 3, kQueryHeads,
                                           1.f / std::sqrt(float{kDim})},
                            held);
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-5));
  CHECK(store(cache).n_tokens_held() == n);  // the clone's question did not touch it
}

TEST_CASE("zipcache bytes are its codes and parameters, exactly; later tokens go gap at a time",
          "[unit]") {
  std::mt19937 rng(1);
  const int64_t n = 200;
  KvCache cache = make_cache("zipcache:gap=10", kShape);
  testing::feed(cache, kQueryHeads, testing::random_chunk(n, kShape, kQueryHeads, rng));
  cache.end_context();
  const int64_t high = n - 80, low = 80;
  const int64_t codes = kHeads * (high * kDim * 4 + low * kDim * 2) / 8;  // keys, values alike
  const int64_t params =
      kHeads * (2 * 2 * kDim + kDim + 2 * n) * 4;  // k min/step, v scale/min/step
  const int64_t positions = kHeads * n * 4;
  const int64_t waiting = kHeads * 10 * (2 * kDim * 4 + 4);  // room for a batch's fp32 rows
  CHECK(store(cache).bytes_resident() == 2 * codes + params + positions + waiting);
  KvCache full = make_full_cache(kShape);
  testing::feed(full, kQueryHeads, testing::random_chunk(n, kShape, kQueryHeads, rng));
  CHECK(store(cache).bytes_resident() < full.layer(0).bytes_resident() / 4);

  for (int step = 1; step <= 25; ++step) {
    testing::decode_step(cache, kQueryHeads, testing::random_chunk(1, kShape, kQueryHeads, rng));
    CHECK(store(cache).n_batches() == 1 + step / 10);
    CHECK(store(cache).n_tokens() == step % 10);
    CHECK(store(cache).n_tokens_held() == n + step);
  }
  CHECK(cache.stats().tokens_evicted == 0);
}

TEST_CASE("zipcache picks its own precision: no eviction or retrieval before it", "[unit]") {
  CHECK_NOTHROW(resolve_method_spec("zipcache"));
  CHECK_THROWS_AS(resolve_method_spec("snapkv:ratio=0.5+zipcache"), InputError);
  CHECK_THROWS_WITH(resolve_method_spec("quest+zipcache"),
                    Catch::Contains("chooses its own precision"));
  CHECK_THROWS_AS(resolve_method_spec("zipcache:low_ratio=1.5"), InputError);
}
