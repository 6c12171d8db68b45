// KVzip (methods/kvzip.cpp): the chat head and the tokens the reconstruction prompt's
// queries attend to are kept, whatever the context's own queries looked at; spans score
// apart; a context never reconstructed is a harness bug, not a silent fallback.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <vector>

#include "cache/registry.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;
using namespace kvbench::testing;

namespace {

constexpr int32_t kHeads = 4;  // two query heads per KV head
constexpr int64_t kContext = 40;

KvShape shape() {
  KvShape s;
  s.n_layers = 2;
  s.n_kv_heads = 2;
  s.head_dim = 8;
  return s;
}

// Small random keys; token `t` of KV head `h` gets a key along channel c (x6) for each
// (h, t, c) in `marked`.
struct Mark {
  int32_t head;
  int64_t token;
  int32_t channel;
};

Chunk context_chunk(const std::vector<Mark>& marked, std::mt19937& rng) {
  Chunk c = random_chunk(kContext, shape(), kHeads, rng);
  for (float& x : c.k) x *= 0.1f;
  for (float& x : c.q) x *= 0.1f;
  const int32_t d = shape().head_dim;
  for (const Mark& m : marked) {
    float* k = c.k.data() + (m.token * shape().n_kv_heads + m.head) * d;
    for (int32_t i = 0; i < d; ++i) k[i] = i == m.channel ? 6.f : 0.f;
  }
  return c;
}

// `n` prompt rows whose first query head of each GQA group looks along `channel` of its KV
// head (the other query heads are zero: uniform attention, below any peak).
Chunk prompt_chunk(int64_t n, const std::vector<int32_t>& channel_by_kv_head, std::mt19937& rng) {
  Chunk c = random_chunk(n, shape(), kHeads, rng);
  for (float& x : c.k) x *= 0.1f;
  std::fill(c.q.begin(), c.q.end(), 0.f);
  const int32_t d = shape().head_dim, group = kHeads / shape().n_kv_heads;
  for (int64_t r = 0; r < n; ++r) {
    for (int32_t h = 0; h < shape().n_kv_heads; ++h) {
      c.q[(r * kHeads + h * group) * d + channel_by_kv_head[h]] = 6.f;
    }
  }
  return c;
}

// A KVzip cache holding the context, its end not yet marked.
KvCache context_in(const std::string& spec, const Chunk& context) {
  KvCache cache = make_cache(spec, shape());
  cache.reserve(kContext + 16);
  feed(cache, kHeads, context);
  return cache;
}

// One reconstruction forward over context span [begin, end), as harness/reconstruction.cpp
// runs it: on a scoring copy, whose policy comes back.
void reconstruct(KvCache& cache, int64_t begin, int64_t end, const Chunk& prompt) {
  KvCache scratch = cache.scoring_copy(begin, end);
  scratch.reserve_more(prompt.n);
  feed(scratch, kHeads, prompt);
  cache.adopt_scoring(std::move(scratch));
}

}  // namespace

TEST_CASE("kvzip keeps what the reconstruction reads, not what the context's queries read",
          "[kvzip][unit]") {
  std::mt19937 rng(7);
  // Head 0 recalls tokens 10, 17, 25 along channel 1; head 1 recalls 5, 30, 33 along channel
  // 2. The context's own last queries look at tokens 12-14 along channel 3 (what SnapKV's
  // window would keep); KVzip never scores by them.
  std::vector<Mark> marks = {{0, 10, 1}, {0, 17, 1}, {0, 25, 1}, {1, 5, 2},  {1, 30, 2},
                             {1, 33, 2}, {0, 12, 3}, {0, 13, 3}, {0, 14, 3}, {1, 12, 3},
                             {1, 13, 3}, {1, 14, 3}};
  Chunk context = context_chunk(marks, rng);
  const int32_t d = shape().head_dim;
  for (int64_t r = kContext - 8; r < kContext; ++r) {
    for (int32_t qh = 0; qh < kHeads; ++qh) context.q[(r * kHeads + qh) * d + 3] = 6.f;
  }
  // The first span starts at 2: tokens 0 and 1 are the chat head, kept.
  KvCache cache = context_in("kvzip:budget=5,level=pair-uniform", context);
  reconstruct(cache, 2, kContext, prompt_chunk(8, {1, 2}, rng));
  CHECK(cache.policy()->bytes_resident(0) == int64_t{2 * kContext} * 4);  // fp32 scores
  cache.end_context();
  for (int32_t l = 0; l < shape().n_layers; ++l) {
    CHECK(kept(cache, l, 0) == std::vector<int32_t>{0, 1, 10, 17, 25});
    CHECK(kept(cache, l, 1) == std::vector<int32_t>{0, 1, 5, 30, 33});
    CHECK(cache.policy()->bytes_resident(l) == 0);  // compressed for good: scores freed
  }
  CHECK(cache.next_position() == kContext);  // the prompt never entered the sequence
}

TEST_CASE("kvzip scores each span by its own forward", "[kvzip][unit]") {
  std::mt19937 rng(11);
  // Span [2, 20) recalls 8 and 9; span [20, 40) recalls 31 and 36 (both heads, channel 1).
  std::vector<Mark> marks;
  for (int32_t h = 0; h < 2; ++h) {
    for (int64_t t : {8, 9, 31, 36}) marks.push_back({h, t, 1});
  }
  const Chunk context = context_chunk(marks, rng);
  KvCache cache = context_in("kvzip:budget=6,level=pair-uniform", context);
  reconstruct(cache, 2, 20, prompt_chunk(6, {1, 1}, rng));
  reconstruct(cache, 20, kContext, prompt_chunk(6, {1, 1}, rng));
  cache.end_context();
  for (int32_t h = 0; h < 2; ++h) CHECK(kept(cache, 1, h) == std::vector<int32_t>{0, 1, 8, 9, 31, 36});
}

TEST_CASE("kvzip level=pair: one threshold over every layer and head, heads of their own",
          "[kvzip][unit]") {
  std::mt19937 rng(7);
  // Head 0 recalls one token (10), head 1 six (5, 20, 21, 22, 30, 33) with equal keys, so
  // equal scores, in both layers (the layers see the same tokens). The budget, 5 per head and
  // layer, is 20 in all. The chat head (0, 1) scores 1 everywhere: 8. Head 0's token 10
  // next: 2. Head 1's recalled tokens share its attention but still outscore head 0's
  // unrecalled ones: the last 10 go to them, all tied, so to the lower layer, then the lower
  // tokens. Per head (level=pair-uniform) head 0 would keep 5.
  const std::vector<int32_t> recalled = {5, 20, 21, 22, 30, 33};
  std::vector<Mark> marks = {{0, 10, 1}};
  for (int32_t t : recalled) marks.push_back({1, t, 2});
  const Chunk context = context_chunk(marks, rng);
  KvCache cache = context_in("kvzip:budget=5", context);  // level=pair, the default
  reconstruct(cache, 2, kContext, prompt_chunk(8, {1, 2}, rng));
  cache.end_context();
  for (int32_t l = 0; l < shape().n_layers; ++l) {
    INFO("layer " << l);
    CHECK(kept(cache, l, 0) == std::vector<int32_t>{0, 1, 10});
    CHECK(cache.layer(l).head_tokens(0) == 3);  // stored ragged: really 3 rows
  }
  CHECK(kept(cache, 0, 1) == std::vector<int32_t>{0, 1, 5, 20, 21, 22, 30, 33});
  CHECK(kept(cache, 1, 1) == std::vector<int32_t>{0, 1, 5, 20, 21, 22});
  KvCache uniform = context_in("kvzip:budget=5,level=pair-uniform", context);
  reconstruct(uniform, 2, kContext, prompt_chunk(8, {1, 2}, rng));
  uniform.end_context();
  CHECK(kept(uniform, 0, 0).size() == 5);
  CHECK_THROWS(resolve_method_spec("kvzip:level=layer"));
}

TEST_CASE("kvzip without its reconstruction is an error, within the budget nothing to do",
          "[kvzip][unit]") {
  std::mt19937 rng(3);
  const Chunk context = context_chunk({}, rng);
  KvCache unscored = context_in("kvzip:budget=5", context);
  CHECK_THROWS_AS(unscored.end_context(), std::logic_error);
  KvCache roomy = context_in("kvzip:budget=64", context);
  roomy.end_context();
  CHECK(kept(roomy, 0, 0).size() == static_cast<size_t>(kContext));
}

TEST_CASE("kvzip spec: budget xor ratio", "[kvzip][unit]") {
  CHECK_NOTHROW(resolve_method_spec("kvzip:ratio=0.5"));
  CHECK_THROWS(resolve_method_spec("kvzip:budget=8,ratio=0.5"));
  CHECK_THROWS(resolve_method_spec("kvzip:ratio=0"));
  CHECK_THROWS(resolve_method_spec("kvzip:sink=4"));
  CHECK(find_method("kvzip")->make_policy(resolve_method_spec("kvzip").components[0].second,
                                          shape())
            ->scores_by_reconstruction());
}
