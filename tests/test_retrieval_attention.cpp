// RetrievalAttention (methods/retrieval_attention.cpp) and its IVF index
// (methods/ivf_index.h): reading everything is the full cache bit for bit, a planted key is
// retrieved, recall on a hand-made index, deterministic k-means, the bytes it reports.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "methods/ivf_index.h"
#include "tests/cache_feed.h"

using namespace kvbench;

namespace {

// Feeds the same random context (ended) and decode steps to every cache; returns each
// cache's attention outputs of every layer for the last step.
std::vector<std::vector<float>> run_same(const std::vector<KvCache*>& caches, int32_t n_heads,
                                         int64_t context, int steps, uint32_t seed) {
  const KvShape& shape = caches[0]->shape();
  std::mt19937 rng(seed);
  const testing::Chunk c = testing::random_chunk(context, shape, n_heads, rng);
  for (KvCache* cache : caches) {
    testing::feed(*cache, n_heads, c);
    cache->end_context();
  }
  std::vector<std::vector<float>> outputs(caches.size());
  for (int s = 0; s < steps; ++s) {
    const testing::Chunk step = testing::random_chunk(1, shape, n_heads, rng);
    for (size_t i = 0; i < caches.size(); ++i) {
      outputs[i] = testing::decode_step(*caches[i], n_heads, step);
    }
  }
  return outputs;
}

std::unique_ptr<ReadPolicy> make_reader(const std::string& spec, const KvShape& shape) {
  return make_cache_parts(resolve_method_spec(spec), shape).reader;
}

double mean_recall(const ReadPolicy& reader) {
  const ReadPolicy::Recall r = reader.recall();
  REQUIRE(r.count > 0);
  return r.sum / static_cast<double>(r.count);
}

}  // namespace

TEST_CASE("retrieval_attention reading every token is the full cache, bit for bit",
          "[unit][retrieval_attention]") {
  const KvShape shape{3, 2, 16};
  KvCache full = make_full_cache(shape);
  // Every cluster probed and top_k over the context: every step reads everything.
  KvCache all =
      make_cache("retrieval_attention:top_k=4096,n_clusters=8,nprobe=8,sink=4,recent=8", shape);
  KvCache sparse =
      make_cache("retrieval_attention:top_k=16,n_clusters=8,nprobe=2,sink=4,recent=8", shape);
  const auto out = run_same({&full, &all, &sparse}, 4, 300, 6, 1);
  CHECK(out[1] == out[0]);
  CHECK(all.stats().bytes_read_last_forward == full.stats().bytes_read_last_forward);
  CHECK(mean_recall(*all.reader()) == 1.0);
  // The sparse reader differs (the check above can fail), but reads less.
  CHECK(out[2] != out[0]);
  CHECK(sparse.stats().bytes_read_last_forward < full.stats().bytes_read_last_forward);
}

TEST_CASE(
    "retrieval_attention probing every cluster of an MHA model has recall 1 and "
    "reports the keys it scanned",
    "[unit][retrieval_attention]") {
  const KvShape shape{2, 2, 16};
  KvCache cache =
      make_cache("retrieval_attention:top_k=20,n_clusters=6,nprobe=6,sink=4,recent=8", shape);
  run_same({&cache}, 2, 200, 3, 7);
  CHECK(mean_recall(*cache.reader()) == 1.0);
  // Last step: 203 tokens; the index holds [4, 195): 191 keys, every one scanned.
  const int64_t d = 16, token_bytes = 2 * d * 4 + 4, indexed = 203 - 8 - 4;
  const int64_t per_head = (4 + 20 + 8) * token_bytes + 6 * d * 4 + indexed * (d * 4 + 4);
  CHECK(cache.stats().bytes_read_last_forward == 2 * 2 * per_head);
}

TEST_CASE("retrieval_attention retrieves a planted key", "[unit][retrieval_attention]") {
  const KvShape shape{1, 2, 16};
  const int32_t n_heads = 4, d = 16;
  const int64_t n = 400, planted = 137;
  std::mt19937 rng(3);
  testing::Chunk c = testing::random_chunk(n, shape, n_heads, rng);
  std::vector<float> q(static_cast<size_t>(n_heads * d));
  std::normal_distribution<float> dist(0.f, 1.f);
  for (float& x : q) x = dist(rng);
  // KV head 1's key at `planted` points along its second query head's query, far out.
  for (int32_t i = 0; i < d; ++i) c.k[(planted * 2 + 1) * d + i] = 30.f * q[3 * d + i];
  auto reader =
      make_reader("retrieval_attention:top_k=4,n_clusters=16,nprobe=1,sink=2,recent=2", shape);
  reader->appended(0, c.k.data(), 0, n);
  reader->context_ended();
  const int32_t position = static_cast<int32_t>(n);
  std::vector<float> out(q.size());
  int64_t bytes = 0;
  const PageSelection* sel = reader->select(
      0, AttentionQuery{q.data(), &position, out.data(), 1, n_heads, 0.25f}, n, &bytes);
  REQUIRE(sel != nullptr);
  REQUIRE(sel->n_selected == 2 + 4 + 2);
  CHECK(sel->page_tokens == 1);
  const int32_t* head1 = sel->pages + sel->n_selected;
  CHECK(std::find(head1, head1 + sel->n_selected, planted) != head1 + sel->n_selected);
  // The window: the first two and the newest two slots, ascending.
  for (int32_t h = 0; h < 2; ++h) {
    const int32_t* s = sel->pages + h * sel->n_selected;
    CHECK(s[0] == 0);
    CHECK(s[1] == 1);
    CHECK(s[6] == n - 2);
    CHECK(s[7] == n - 1);
    CHECK(std::is_sorted(s, s + sel->n_selected));
  }
  CHECK(bytes > 2 * 16 * d * 4);  // both heads' centroids, and the keys probed
}

TEST_CASE("retrieval_attention recall on a hand-made index", "[unit][retrieval_attention]") {
  // One KV head, one query head, 2-d keys: cluster A on the x axis, cluster B on the y axis,
  // then one recent slot. q = (1, 1): the exact top 4 are A0 (10), B0 (9.5), A1 (9), B1 (8.5).
  const KvShape shape{1, 1, 2};
  const std::vector<float> keys = {10, 0, 9, 0, 8, 0, 7, 0, 0, 9.5f, 0, 8.5f, 0, 1, 0, 0.5f, 0, 0};
  const std::vector<float> q = {1, 1};
  const int32_t position = 9;
  std::vector<float> out(2);
  for (int nprobe : {1, 2}) {
    auto reader =
        make_reader("retrieval_attention:top_k=4,n_clusters=2,nprobe=" + std::to_string(nprobe) +
                        ",sink=0,recent=1",
                    shape);
    reader->appended(0, keys.data(), 0, 9);
    reader->context_ended();
    int64_t bytes = 0;
    const PageSelection* sel =
        reader->select(0, AttentionQuery{q.data(), &position, out.data(), 1, 1, 1.f}, 9, &bytes);
    REQUIRE(sel != nullptr);
    const std::vector<int32_t> got(sel->pages, sel->pages + sel->n_selected);
    if (nprobe == 1) {
      // Centroid A (8.5, 0) scores 8.5 over B's 4.875: A's four keys, two of the top four.
      CHECK(got == std::vector<int32_t>{0, 1, 2, 3, 8});
      CHECK(mean_recall(*reader) == 0.5);
    } else {
      CHECK(got == std::vector<int32_t>{0, 1, 4, 5, 8});
      CHECK(mean_recall(*reader) == 1.0);
    }
  }
}

TEST_CASE("IvfIndex: k-means is deterministic and its lists partition the keys",
          "[unit][retrieval_attention]") {
  const int32_t d = 8;
  const int64_t n = 500;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> keys(static_cast<size_t>(n * d));
  for (float& x : keys) x = dist(rng);
  IvfIndex a, b, other;
  a.build(keys.data(), d, 10, n, 12, 10, 42);
  b.build(keys.data(), d, 10, n, 12, 10, 42);
  other.build(keys.data(), d, 10, n, 12, 10, 43);
  REQUIRE(a.n_clusters() == 12);
  CHECK(a.size() == n);
  std::vector<int32_t> seen;
  bool same = true, differs = false;
  for (int32_t c = 0; c < a.n_clusters(); ++c) {
    same = same && a.list(c) == b.list(c) &&
           std::equal(a.centroid(c), a.centroid(c) + d, b.centroid(c));
    differs = differs || a.list(c) != other.list(c);
    seen.insert(seen.end(), a.list(c).begin(), a.list(c).end());
  }
  CHECK(same);
  CHECK(differs);  // another seed starts elsewhere
  std::sort(seen.begin(), seen.end());
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 10);
  CHECK(seen == all);
  // Fewer keys than clusters: one cluster per key.
  IvfIndex small;
  small.build(keys.data(), d, 0, 5, 12, 10, 42);
  CHECK(small.n_clusters() == 5);
}

TEST_CASE("retrieval_attention counts its index in the cache's bytes",
          "[unit][retrieval_attention]") {
  const KvShape shape{2, 2, 16};
  KvCache full = make_full_cache(shape);
  KvCache cache =
      make_cache("retrieval_attention:top_k=16,n_clusters=8,nprobe=2,sink=4,recent=8", shape);
  std::mt19937 rng(5);
  const testing::Chunk c = testing::random_chunk(100, shape, 4, rng);
  testing::feed(full, 4, c);
  testing::feed(cache, 4, c);
  const int64_t keys_copy = full.stats().bytes_resident;
  // Before the index: the keys' copy alone (at least 100 keys per layer and KV head).
  const int64_t before = cache.stats().bytes_resident - keys_copy;
  CHECK(before >= 2 * 2 * 100 * 16 * 4);
  cache.end_context();
  // The index adds its centroids and list slots (88 indexed keys per layer and head).
  CHECK(cache.stats().bytes_resident - keys_copy - before >= 2 * 2 * (8 * 16 * 4 + 88 * 4));
}

TEST_CASE("retrieval_attention refuses bad parameters and eviction before it",
          "[unit][retrieval_attention]") {
  CHECK_THROWS_AS(resolve_method_spec("retrieval_attention:nprobe=600"), InputError);
  CHECK_THROWS_WITH(resolve_method_spec("retrieval_attention:n_clusters=8,nprobe=9"),
                    Catch::Contains("nprobe=9 exceeds n_clusters=8"));
  CHECK_THROWS_AS(resolve_method_spec("retrieval_attention:recent=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("retrieval_attention:top_k=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("snapkv:ratio=0.5+retrieval_attention"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("quest+retrieval_attention"), InputError);
  CHECK_NOTHROW(resolve_method_spec("retrieval_attention:top_k=64+kivi:bits=4"));
}

TEST_CASE("retrieval_attention over kivi reads the chosen tokens from the packed store",
          "[unit][retrieval_attention]") {
  const KvShape shape{2, 2, 32};
  KvCache kivi = make_cache("kivi:bits=4", shape);
  KvCache all = make_cache(
      "retrieval_attention:top_k=4096,n_clusters=8,nprobe=8,sink=4,recent=8+kivi:bits=4", shape);
  KvCache sparse = make_cache(
      "retrieval_attention:top_k=16,n_clusters=8,nprobe=2,sink=4,recent=8+kivi:bits=4", shape);
  const auto out = run_same({&kivi, &all, &sparse}, 4, 300, 3, 9);
  CHECK(out[1] == out[0]);
  CHECK(out[2] != out[0]);
  CHECK(sparse.stats().bytes_read_last_forward < kivi.stats().bytes_read_last_forward);
  CHECK(mean_recall(*sparse.reader()) < 1.0);
}

TEST_CASE("retrieval_attention rebuilds its index when indexed slots are written again",
          "[unit][retrieval_attention]") {
  // One KV head, one query head: the query points along x; the context's keys do not.
  const KvShape shape{1, 1, 4};
  const int64_t n = 64;
  std::vector<float> keys(static_cast<size_t>(n * 4), 0.f);
  for (int64_t t = 0; t < n; ++t) keys[t * 4 + 1 + t % 3] = 1.f + 0.01f * t;
  const std::vector<float> q = {1, 0, 0, 0};
  auto reader =
      make_reader("retrieval_attention:top_k=2,n_clusters=4,nprobe=1,sink=1,recent=1", shape);
  reader->appended(0, keys.data(), 0, n);
  reader->context_ended();
  // Slots from 40 on written again: slot 50 now holds the key the query wants.
  std::vector<float> rewritten(keys.begin() + 40 * 4, keys.end());
  rewritten[10 * 4 + 0] = 5.f;
  reader->appended(0, rewritten.data(), 40, n - 40);
  const int32_t position = static_cast<int32_t>(n);
  std::vector<float> out(4);
  int64_t bytes = 0;
  const PageSelection* sel =
      reader->select(0, AttentionQuery{q.data(), &position, out.data(), 1, 1, 1.f}, n, &bytes);
  REQUIRE(sel != nullptr);
  const std::vector<int32_t> got(sel->pages, sel->pages + sel->n_selected);
  CHECK(std::find(got.begin(), got.end(), 50) != got.end());
  CHECK(got.front() == 0);
  CHECK(got.back() == n - 1);
}
