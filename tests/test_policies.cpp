// Score-free and last-query eviction policies (StreamingLLM, TOVA, Knorm, KeyDiff) driven
// through a real KvCache of dense stores with hand-built keys, values and queries, on
// inputs where the kept set is known: checked exactly, per head, across decode steps.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/scores.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;
using kvbench::testing::Chunk;
using kvbench::testing::feed;
using kvbench::testing::kept;
using kvbench::testing::random_chunk;

namespace {

// A cache of dense stores with the policy `spec` builds (registry defaults filled in).
KvCache policy_cache(const std::string& spec, const KvShape& shape) {
  const ResolvedSpec resolved = resolve_method_spec(spec);
  REQUIRE(resolved.components.size() == 1);
  const MethodInfo& info = *resolved.components[0].first;
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    layers.push_back(std::make_unique<DenseLayerKv>(shape.n_kv_heads, shape.head_dim));
  }
  return KvCache(shape, std::move(layers), info.make_policy(resolved.components[0].second, shape));
}

float* key_of(Chunk& c, const KvShape& shape, int64_t i, int32_t h) {
  return c.k.data() + (i * shape.n_kv_heads + h) * shape.head_dim;
}

std::vector<int32_t> range(int32_t begin, int32_t end) {
  std::vector<int32_t> out(end - begin);
  std::iota(out.begin(), out.end(), begin);
  return out;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The `k` indices with the largest value (ties: the lower index), ascending.
std::vector<int32_t> top_k_reference(const std::vector<double>& values, int64_t k) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return values[a] > values[b]; });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

int64_t evicted(const KvCache& cache) { return cache.stats().tokens_evicted; }

}  // namespace

TEST_CASE("streamingllm keeps the sinks and the recent window, one eviction per decode step",
          "[unit]") {
  const KvShape shape{3, 2, 8};
  const int32_t n_heads = 4;
  std::mt19937 rng(1);
  KvCache cache = policy_cache("streamingllm:budget=10,sink=2,prefill=stream,chunk=8", shape);

  // A streamed prefill in chunks of 8 evicts after each chunk.
  for (int chunk = 0; chunk < 4; ++chunk) {
    feed(cache, n_heads, random_chunk(8, shape, n_heads, rng));
    const int32_t seen = cache.next_position();
    const std::vector<int32_t> expected =
        seen <= 10 ? range(0, seen) : concat(range(0, 2), range(seen - 8, seen));
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) REQUIRE(kept(cache, l, h) == expected);
    }
  }
  cache.end_context();
  CHECK(kept(cache, 0, 0) == concat(range(0, 2), range(24, 32)));

  for (int step = 0; step < 5; ++step) {
    const int64_t before = evicted(cache);
    feed(cache, n_heads, random_chunk(1, shape, n_heads, rng));
    const int32_t seen = cache.next_position();
    CHECK(evicted(cache) - before == shape.n_layers);  // one token per layer
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        REQUIRE(kept(cache, l, h) == concat(range(0, 2), range(seen - 8, seen)));
      }
    }
  }
}

TEST_CASE("streamingllm with a ratio waits for the context, then holds the resolved budget",
          "[unit]") {
  const KvShape shape{2, 2, 8};
  const int32_t n_heads = 2;
  std::mt19937 rng(2);
  KvCache cache = policy_cache("streamingllm:ratio=0.25", shape);  // sink 4 by default
  for (int chunk = 0; chunk < 3; ++chunk)
    feed(cache, n_heads, random_chunk(14, shape, n_heads, rng));
  CHECK(evicted(cache) == 0);  // a ratio is unknown until the context ends
  cache.end_context();         // 42 tokens * 0.25 = 10.5 -> 11 (rounded up)
  CHECK(kept(cache, 1, 1) == concat(range(0, 4), range(35, 42)));
  feed(cache, n_heads, random_chunk(1, shape, n_heads, rng));
  CHECK(kept(cache, 1, 0) == concat(range(0, 4), range(36, 43)));
}

TEST_CASE("streamingllm keeps the newest token when a ratio resolves below the sinks", "[unit]") {
  const KvShape shape{1, 1, 8};
  std::mt19937 rng(12);
  KvCache cache = policy_cache("streamingllm:ratio=0.125,sink=4", shape);
  feed(cache, 1, random_chunk(24, shape, 1, rng));
  cache.end_context();  // 24 * 0.125 = 3 tokens: 2 sinks and the newest
  CHECK(kept(cache, 0, 0) == std::vector<int32_t>{0, 1, 23});
}

TEST_CASE("streamingllm rejects a sink that leaves no recent window", "[unit]") {
  CHECK_THROWS_AS(resolve_method_spec("streamingllm:budget=4,sink=4"), InputError);
  CHECK_NOTHROW(resolve_method_spec("streamingllm:budget=5,sink=4"));
}

TEST_CASE("knorm keeps the lowest-norm keys per head and leaves the skipped layers whole",
          "[unit]") {
  const KvShape shape{3, 2, 8};
  const int32_t n_heads = 4, n_context = 40, budget = 10;
  std::mt19937 rng(3);
  Chunk c = random_chunk(n_context, shape, n_heads, rng);
  // Head h's key t gets norm 1 + rank_h(t), a different shuffle per head: the kept set is
  // the positions ranked below the budget.
  std::vector<std::vector<int32_t>> rank(shape.n_kv_heads, range(0, n_context));
  for (auto& r : rank) std::shuffle(r.begin(), r.end(), rng);
  for (int32_t t = 0; t < n_context; ++t) {
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      float* k = key_of(c, shape, t, h);
      float norm = 0;
      for (int32_t d = 0; d < shape.head_dim; ++d) norm += k[d] * k[d];
      const float scale = (1.f + rank[h][t]) / std::sqrt(norm);
      for (int32_t d = 0; d < shape.head_dim; ++d) k[d] *= scale;
    }
  }
  KvCache cache = policy_cache("knorm:budget=10,skip=1", shape);
  feed(cache, n_heads, c);
  const int64_t bytes_full = cache.bytes_resident();
  CHECK(evicted(cache) == 0);  // Knorm compresses at ContextEnd only
  cache.end_context();

  std::vector<std::vector<int32_t>> expected(shape.n_kv_heads);
  for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
    for (int32_t t = 0; t < n_context; ++t) {
      if (rank[h][t] < budget) expected[h].push_back(t);
    }
  }
  REQUIRE(expected[0] != expected[1]);
  for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
    CHECK(kept(cache, 0, h) == range(0, n_context));  // layer 0 skipped
    for (int32_t l = 1; l < shape.n_layers; ++l) CHECK(kept(cache, l, h) == expected[h]);
  }
  CHECK(evicted(cache) == 2 * (n_context - budget));
  CHECK(cache.bytes_resident() < bytes_full);

  // Later tokens are appended uncompressed.
  for (int step = 0; step < 3; ++step) feed(cache, n_heads, random_chunk(1, shape, n_heads, rng));
  CHECK(kept(cache, 2, 1) == concat(expected[1], range(40, 43)));
  CHECK(evicted(cache) == 2 * (n_context - budget));
}

TEST_CASE("knorm with a ratio resolves from the context length", "[unit]") {
  const KvShape shape{2, 1, 8};
  std::mt19937 rng(4);
  KvCache cache = policy_cache("knorm:ratio=0.25,skip=0", shape);
  feed(cache, 2, random_chunk(42, shape, 2, rng));
  cache.end_context();
  for (int32_t l = 0; l < shape.n_layers; ++l) CHECK(cache.layer(l).n_tokens() == 11);
}

namespace {

// Keys of one head: most point near e0 (with random norms), `outliers` point along
// e1, e2, ... . The outliers are the least similar to the mean normalised key.
void plant_keydiff_keys(Chunk& c, const KvShape& shape, int32_t h,
                        const std::vector<int32_t>& outliers, int32_t first_position,
                        std::mt19937& rng) {
  std::normal_distribution<float> noise(0.f, 0.1f);
  std::uniform_real_distribution<float> norm(0.5f, 5.f);
  for (int64_t i = 0; i < c.n; ++i) {
    float* k = key_of(c, shape, i, h);
    const float scale = norm(rng);
    for (int32_t d = 0; d < shape.head_dim; ++d) k[d] = scale * noise(rng);
    const auto it = std::find(outliers.begin(), outliers.end(), first_position + i);
    const int32_t axis = it == outliers.end() ? 0 : 1 + static_cast<int32_t>(it - outliers.begin());
    k[axis] += scale;
  }
}

// KeyDiff over one head, in double: anchor = mean of the normalised keys, keep the
// `budget` lowest cosines (ties: the lower slot), slot order kept.
std::vector<int32_t> keydiff_reference(const std::vector<std::vector<float>>& keys,
                                       int64_t budget) {
  const size_t d = keys[0].size();
  std::vector<double> anchor(d, 0.0);
  std::vector<std::vector<double>> unit;
  for (const auto& k : keys) {
    double norm = 0;
    for (float x : k) norm += double(x) * x;
    norm = std::sqrt(norm);
    std::vector<double> u(d);
    for (size_t i = 0; i < d; ++i) anchor[i] += (u[i] = k[i] / norm) / keys.size();
    unit.push_back(u);
  }
  double anchor_norm = 0;
  for (double a : anchor) anchor_norm += a * a;
  anchor_norm = std::sqrt(anchor_norm);
  std::vector<double> neg_cosine;
  for (const auto& u : unit) {
    double dot = 0;
    for (size_t i = 0; i < d; ++i) dot += u[i] * anchor[i];
    neg_cosine.push_back(-dot / anchor_norm);
  }
  return top_k_reference(neg_cosine, budget);
}

}  // namespace

TEST_CASE("keydiff keeps the keys that stand out from the mean direction, per head", "[unit]") {
  const KvShape shape{2, 2, 8};
  const int32_t n_heads = 4, n_context = 60;
  std::mt19937 rng(5);
  Chunk c = random_chunk(n_context, shape, n_heads, rng);
  const std::vector<std::vector<int32_t>> outliers = {{3, 17, 30, 44, 58}, {0, 9, 25, 26, 51}};
  for (int32_t h = 0; h < shape.n_kv_heads; ++h)
    plant_keydiff_keys(c, shape, h, outliers[h], 0, rng);
  // A dense prefill: nothing goes before the context ends, then all of it at once.
  KvCache cache = policy_cache("keydiff:budget=5", shape);
  feed(cache, n_heads, c);
  CHECK(evicted(cache) == 0);
  cache.end_context();
  CHECK(evicted(cache) == shape.n_layers * (n_context - 5));
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) CHECK(kept(cache, l, h) == outliers[h]);
  }
  // Not applied after the context.
  feed(cache, n_heads, random_chunk(3, shape, n_heads, rng));
  CHECK(cache.layer(0).n_tokens() == 8);
}

TEST_CASE("keydiff prefill=stream evicts chunk by chunk, holding at most budget + chunk",
          "[unit]") {
  const KvShape shape{2, 2, 8};
  const int32_t n_heads = 2, n_context = 200, budget = 8;
  std::mt19937 rng(6);
  KvCache cache = policy_cache("keydiff:budget=8,prefill=stream,chunk=16", shape);
  const int64_t block = cache.policy()->context_block();
  REQUIRE(block == 16);
  const std::vector<std::vector<int32_t>> outliers = {{3, 20, 41, 60, 77, 95},
                                                      {10, 11, 50, 66, 80, 99}};
  // The test's own block-wise simulation: per head, the keys held, by position.
  std::vector<std::vector<int32_t>> ref_positions(shape.n_kv_heads);
  std::vector<std::vector<std::vector<float>>> ref_keys(shape.n_kv_heads);
  for (int32_t start = 0; start < n_context; start += block) {
    const int64_t n = std::min<int64_t>(block, n_context - start);
    Chunk c = random_chunk(n, shape, n_heads, rng);
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      plant_keydiff_keys(c, shape, h, outliers[h], start, rng);
      for (int64_t i = 0; i < n; ++i) {
        const float* k = key_of(c, shape, i, h);
        ref_positions[h].push_back(start + static_cast<int32_t>(i));
        ref_keys[h].emplace_back(k, k + shape.head_dim);
      }
      if (static_cast<int64_t>(ref_positions[h].size()) > budget) {
        std::vector<int32_t> positions;
        std::vector<std::vector<float>> keys;
        for (int32_t slot : keydiff_reference(ref_keys[h], budget)) {
          positions.push_back(ref_positions[h][slot]);
          keys.push_back(ref_keys[h][slot]);
        }
        ref_positions[h] = positions;
        ref_keys[h] = keys;
      }
    }
    feed(cache, n_heads, c);
    REQUIRE(cache.layer(1).n_tokens() <= budget);
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) REQUIRE(kept(cache, 1, h) == ref_positions[h]);
  }
  // A layer never held more than budget + block tokens, so the peak stays far below what
  // the whole context takes (with the store's growth slack on top).
  const int64_t token_bytes = static_cast<int64_t>(
      shape.n_kv_heads * (2 * shape.head_dim * sizeof(float) + sizeof(int32_t)));
  CHECK(cache.stats().bytes_peak < shape.n_layers * token_bytes * n_context / 2);
  cache.end_context();
  for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
    const std::vector<int32_t> final_kept = kept(cache, 0, h);
    CHECK(final_kept == ref_positions[h]);
    for (int32_t p : outliers[h]) CHECK(std::count(final_kept.begin(), final_kept.end(), p) == 1);
  }
}

TEST_CASE("keydiff with a ratio waits for the context end and asks for no blocks", "[unit]") {
  const KvShape shape{1, 2, 8};
  std::mt19937 rng(7);
  KvCache cache = policy_cache("keydiff:ratio=0.25", shape);
  CHECK(cache.policy()->context_block() == 0);
  feed(cache, 2, random_chunk(20, shape, 2, rng));
  feed(cache, 2, random_chunk(22, shape, 2, rng));
  CHECK(evicted(cache) == 0);
  cache.end_context();
  CHECK(cache.layer(0).n_tokens() == 11);
}

namespace {

// TOVA's score in double: softmax attention of query row `q` ([n_heads, head_dim]) over
// `keys` (per KV head, the held keys in slot order), averaged over the query heads.
std::vector<double> tova_reference(const float* q, int32_t n_heads,
                                   const std::vector<std::vector<std::vector<float>>>& keys) {
  const int32_t n_kv_heads = static_cast<int32_t>(keys.size());
  const size_t n = keys[0].size(), d = keys[0][0].size();
  std::vector<double> score(n, 0.0);
  for (int32_t h = 0; h < n_heads; ++h) {
    const auto& head_keys = keys[h / (n_heads / n_kv_heads)];
    std::vector<double> logit(n);
    for (size_t t = 0; t < n; ++t) {
      double dot = 0;
      for (size_t i = 0; i < d; ++i) dot += double(q[h * d + i]) * head_keys[t][i];
      logit[t] = dot / std::sqrt(double(d));
    }
    const double top = *std::max_element(logit.begin(), logit.end());
    double sum = 0;
    for (double& x : logit) sum += (x = std::exp(x - top));
    for (size_t t = 0; t < n; ++t) score[t] += logit[t] / sum / n_heads;
  }
  return score;
}

// A TOVA run with the test's own record of every key, by position.
struct TovaRig {
  KvShape shape{2, 2, 8};
  int32_t n_heads = 4;
  std::vector<std::vector<std::vector<float>>> keys_by_position;  // [position][kv head]

  void record(const Chunk& c) {
    for (int64_t i = 0; i < c.n; ++i) {
      std::vector<std::vector<float>> per_head;
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        const float* k = c.k.data() + (i * shape.n_kv_heads + h) * shape.head_dim;
        per_head.emplace_back(k, k + shape.head_dim);
      }
      keys_by_position.push_back(per_head);
    }
  }

  // What TOVA must keep of `held` positions after `c` (already recorded) is fed.
  std::vector<int32_t> expected(const std::vector<int32_t>& held, const Chunk& c,
                                int64_t budget) const {
    std::vector<std::vector<std::vector<float>>> keys(shape.n_kv_heads);
    for (int32_t p : held) {
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) keys[h].push_back(keys_by_position[p][h]);
    }
    const float* last_q = c.q.data() + (c.n - 1) * n_heads * shape.head_dim;
    std::vector<int32_t> out;
    for (int32_t slot : top_k_reference(tova_reference(last_q, n_heads, keys), budget)) {
      out.push_back(held[slot]);
    }
    return out;
  }
};

}  // namespace

TEST_CASE("tova keeps what the last query attends to and evicts one token per decode step",
          "[unit]") {
  TovaRig rig;
  const KvShape& shape = rig.shape;
  const int32_t budget = 12;
  std::mt19937 rng(8);
  KvCache cache = policy_cache("tova:budget=12", shape);

  Chunk first = random_chunk(24, shape, rig.n_heads, rng);
  Chunk second = random_chunk(16, shape, rig.n_heads, rng);
  // The context's last query looks along e0; the keys at these positions point there.
  const std::vector<int32_t> attended = {2, 7, 13, 21, 30, 33};
  for (int32_t h = 0; h < rig.n_heads; ++h) {
    float* q = second.q.data() + (15 * rig.n_heads + h) * shape.head_dim;
    std::fill(q, q + shape.head_dim, 0.f);
    q[0] = 6.f;
  }
  for (int32_t p : attended) {
    Chunk& c = p < 24 ? first : second;
    for (int32_t h = 0; h < shape.n_kv_heads; ++h)
      key_of(c, shape, p < 24 ? p : p - 24, h)[0] = 5.f;
  }
  rig.record(first);
  rig.record(second);
  feed(cache, rig.n_heads, first);
  feed(cache, rig.n_heads, second);
  CHECK(evicted(cache) == 0);  // TOVA leaves context chunks whole
  const int64_t policy_bytes_full = cache.policy()->bytes_resident(0);
  CHECK(policy_bytes_full > 0);  // the last query's scores, one per slot
  cache.end_context();

  std::vector<int32_t> expected = rig.expected(range(0, 40), second, budget);
  for (int32_t p : attended) CHECK(std::count(expected.begin(), expected.end(), p) == 1);
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) REQUIRE(kept(cache, l, h) == expected);
  }
  CHECK(cache.policy()->bytes_resident(0) < policy_bytes_full);
  const CacheStats stats = cache.stats();
  CHECK(stats.bytes_per_layer[1] ==
        cache.layer(1).bytes_resident() + cache.policy()->bytes_resident(1));

  for (int step = 0; step < 6; ++step) {
    Chunk token = random_chunk(1, shape, rig.n_heads, rng);
    rig.record(token);
    const int64_t before = evicted(cache);
    const std::vector<int32_t> held = concat(kept(cache, 0, 0), {cache.next_position()});
    feed(cache, rig.n_heads, token);
    CHECK(evicted(cache) - before == shape.n_layers);
    expected = rig.expected(held, token, budget);
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) REQUIRE(kept(cache, l, h) == expected);
    }
  }
}

TEST_CASE("tova with a ratio holds the budget resolved at the context end", "[unit]") {
  const KvShape shape{2, 2, 8};
  std::mt19937 rng(9);
  KvCache cache = policy_cache("tova:ratio=0.25", shape);
  feed(cache, 4, random_chunk(42, shape, 4, rng));
  cache.end_context();
  CHECK(cache.layer(0).n_tokens() == 11);
  for (int step = 0; step < 3; ++step) {
    feed(cache, 4, random_chunk(1, shape, 4, rng));
    CHECK(cache.layer(1).n_tokens() == 11);
  }
}

TEST_CASE("a clone evicts on its own: the original keeps its tokens and policy state", "[unit]") {
  const KvShape shape{2, 2, 8};
  std::mt19937 rng(10);
  KvCache cache = policy_cache("tova:budget=10", shape);
  feed(cache, 4, random_chunk(30, shape, 4, rng));
  cache.end_context();
  const std::vector<int32_t> before = kept(cache, 1, 0);

  KvCache branch = cache.clone();
  const Chunk same = random_chunk(1, shape, 4, rng);
  feed(branch, 4, random_chunk(1, shape, 4, rng));
  feed(branch, 4, random_chunk(1, shape, 4, rng));
  CHECK(kept(cache, 1, 0) == before);
  CHECK(cache.next_position() == 30);

  // The clone carried the same state: the same token gives both the same eviction.
  KvCache twin = cache.clone();
  feed(cache, 4, same);
  feed(twin, 4, same);
  for (int32_t l = 0; l < shape.n_layers; ++l) CHECK(kept(cache, l, 1) == kept(twin, l, 1));
  CHECK(cache.policy()->bytes_resident(0) == twin.policy()->bytes_resident(0));
}

TEST_CASE("a budget at least the context drops nothing", "[unit]") {
  const KvShape shape{2, 2, 8};
  for (const char* spec : {"streamingllm:budget=64", "tova:budget=64", "knorm:budget=64,skip=0",
                           "keydiff:budget=64", "knorm:ratio=1,skip=0", "keydiff:ratio=1"}) {
    INFO(spec);
    std::mt19937 rng(11);
    KvCache cache = policy_cache(spec, shape);
    feed(cache, 4, random_chunk(40, shape, 4, rng));
    cache.end_context();
    for (int step = 0; step < 4; ++step) feed(cache, 4, random_chunk(1, shape, 4, rng));
    CHECK(evicted(cache) == 0);
    CHECK(kept(cache, 1, 1) == range(0, 44));
  }
}

TEST_CASE("retain_rows moves per-slot state with the plan and gives memory back", "[unit]") {
  // Two KV heads keeping different slots; state per query head (2 per KV head) and per layer.
  RetainPlan plan;
  plan.n_keep = 2;
  plan.slots = {1, 3, 0, 2};
  std::vector<float> per_query_head = {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33};
  retain_rows(per_query_head, 4, 4, plan, 2);
  CHECK(per_query_head == std::vector<float>{1, 3, 11, 13, 20, 22, 30, 32});

  std::vector<int32_t> per_layer(100);
  std::iota(per_layer.begin(), per_layer.end(), 0);
  RetainPlan same;
  plan_same_slots({5, 50, 99}, 3, same);
  CHECK(same.slots == std::vector<int32_t>{5, 50, 99, 5, 50, 99, 5, 50, 99});
  retain_rows(per_layer, 1, 100, same, 3);
  CHECK(per_layer == std::vector<int32_t>{5, 50, 99});
  CHECK(vector_bytes(per_layer) < 100 * static_cast<int64_t>(sizeof(int32_t)));
}

TEST_CASE("streamingllm's dense prefill keeps the whole context until it ends", "[unit]") {
  // kvpress and SCBench compress once after a dense prefill; the chunks the context comes
  // in do not matter.
  const KvShape shape{2, 2, 8};
  std::mt19937 rng(3);
  KvCache cache = policy_cache("streamingllm:budget=10,sink=2", shape);
  for (int chunk = 0; chunk < 4; ++chunk) feed(cache, 4, random_chunk(8, shape, 4, rng));
  CHECK(evicted(cache) == 0);
  CHECK(cache.stats().bytes_peak >= cache.stats().bytes_resident);
  cache.end_context();
  CHECK(kept(cache, 0, 0) == concat(range(0, 2), range(24, 32)));
}

namespace {

// What HostPolicyOnDevice does for a policy that scores by received attention, on the host:
// observe sums attention_scores_cpu over the rows the policy names and hands it to
// observe_scores; plan shows the slots' positions only (null keys and values) unless the
// policy plans on them (plans_on_kv). The wrapper itself is scored by nothing, so a cache
// holding it attends and observes in two passes.
class ScoresOnly : public TokenPolicy {
 public:
  explicit ScoresOnly(std::unique_ptr<TokenPolicy> inner) : inner_(std::move(inner)) {}
  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<ScoresOnly>(inner_->clone());
  }
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    REQUIRE(inner_->scored_rows() != ScoredRows::None);
    const AttentionQuery rows = inner_->scored_rows() == ScoredRows::Last
                                    ? last_query_row(query, kv.head_dim)
                                    : query;
    std::vector<float> scores(static_cast<size_t>(query.n_heads) * kv.n_tokens, 0.f);
    attention_scores_cpu(rows, kv, scores.data());
    inner_->observe_scores(layer, scores.data(), query.n_heads, kv.n_tokens);
  }
  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (inner_->plans_on_kv()) return inner_->plan(layer, kv, phase, plan);
    DenseKv positions_only = kv;
    positions_only.k = nullptr;
    positions_only.v = nullptr;
    return inner_->plan(layer, positions_only, phase, plan);
  }
  void retained(int32_t layer, const RetainPlan& plan) override { inner_->retained(layer, plan); }
  int64_t bytes_resident(int32_t layer) const override { return inner_->bytes_resident(layer); }

 private:
  std::unique_ptr<TokenPolicy> inner_;
};

}  // namespace

// The policies scored by every row (h2o, d2o) are handed their scores by the attention pass
// itself in `direct` (KvCache::attend_scored) while the context comes in (40 and 20 query
// rows), and by attention_scores_cpu at decode steps; through ScoresOnly always by the latter.
TEST_CASE("h2o, d2o and tova decide the same from observe_scores as from observe (the GPU path)",
          "[unit]") {
  const KvShape shape{2, 2, 16};
  const int32_t n_heads = 4;
  for (const char* spec : {"h2o:budget=24", "h2o:ratio=0.5", "d2o:budget=24", "d2o:ratio=0.5",
                           "tova:budget=24", "tova:ratio=0.5"}) {
    INFO(spec);
    KvCache direct = policy_cache(spec, shape);
    const ResolvedSpec resolved = resolve_method_spec(spec);
    const auto& [info, params] = resolved.components[0];
    std::vector<std::unique_ptr<LayerKv>> layers;
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      layers.push_back(std::make_unique<DenseLayerKv>(shape.n_kv_heads, shape.head_dim));
    }
    KvCache via_scores(shape, std::move(layers),
                       std::make_unique<ScoresOnly>(info->make_policy(params, shape)));
    std::mt19937 rng(31);
    // A context in two chunks, then decode steps that evict one token each.
    for (const int64_t n : {40, 20}) {
      const Chunk c = random_chunk(n, shape, n_heads, rng);
      feed(direct, n_heads, c);
      feed(via_scores, n_heads, c);
    }
    direct.end_context();
    via_scores.end_context();
    for (int step = 0; step < 8; ++step) {
      const Chunk token = random_chunk(1, shape, n_heads, rng);
      feed(direct, n_heads, token);
      feed(via_scores, n_heads, token);
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
          REQUIRE(kept(via_scores, l, h) == kept(direct, l, h));
        }
      }
    }
    // It did evict (60 + 8 tokens fed a layer; d2o splits its budget over the layers).
    CHECK(kept(direct, 0, 0).size() + kept(direct, 1, 0).size() <= 60);
  }
}
