// SCOPE (methods/scope.cpp): SnapKV compresses the context, which then stays as it is; the
// tokens after the context keep the newest `recent` plus the ones the current query attends
// to most, up to a decode budget that is fixed (slide) or grows (adaptive, discontinuous).
#include <catch2/catch.hpp>
#include <vector>

#include "cache/registry.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // two query heads over one KV head
constexpr int32_t kDim = 4;

// n tokens whose keys are `spikes[i]` along channel 0 (0 past its end); every query looks
// along channel 0.
testing::Chunk tokens(int64_t n, const std::vector<float>& spikes) {
  testing::Chunk c;
  c.n = n;
  c.k.assign(n * kDim, 0.f);
  c.v.assign(c.k.size(), 1.f);
  c.q.assign(n * kHeads * kDim, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    if (t < static_cast<int64_t>(spikes.size())) c.k[t * kDim] = spikes[t];
    for (int32_t h = 0; h < kHeads; ++h) c.q[(t * kHeads + h) * kDim] = 1.f;
  }
  return c;
}

// A 12-token context with spikes at 1, 3, 5, 7 (SnapKV keeps them and the window 10-11 at
// budget 6), then decode tokens 12-17 with keys 9, 0, 1, 0, 0, 0.
KvCache scope_after(const std::string& spec, int n_decode) {
  KvCache cache = make_cache(spec, KvShape{1, 1, kDim});
  testing::feed(cache, kHeads, tokens(12, {0, 6, 0, 6, 0, 6, 0, 6}));
  cache.end_context();
  const std::vector<float> keys = {9, 0, 1, 0, 0, 0};
  for (int i = 0; i < n_decode; ++i) testing::decode_step(cache, kHeads, tokens(1, {keys[i]}));
  return cache;
}

}  // namespace

TEST_CASE("scope freezes SnapKV's context and slides a decode window", "[unit]") {
  const std::string spec = "scope:budget=6,window=2,kernel=1,decode_window=4,recent=2";
  CHECK(testing::kept(scope_after(spec, 4), 0, 0) ==
        std::vector<int32_t>{1, 3, 5, 7, 10, 11, 12, 13, 14, 15});
  // Five decode tokens over a window of 4: the newest two (15, 16) and the two the current
  // query attends to most among 12-14 (12's key 9, 14's key 1); the context untouched.
  CHECK(testing::kept(scope_after(spec, 5), 0, 0) ==
        std::vector<int32_t>{1, 3, 5, 7, 10, 11, 12, 14, 15, 16});
  CHECK(testing::kept(scope_after(spec, 6), 0, 0) ==
        std::vector<int32_t>{1, 3, 5, 7, 10, 11, 12, 14, 16, 17});
}

TEST_CASE("scope adaptive grows the decode part by one every delta tokens", "[unit]") {
  const std::string spec =
      "scope:budget=6,window=2,kernel=1,mode=adaptive,recent=2,delta=2,decode_window=3";
  // After s decode tokens the part holds 2 + (s - 1) / 2: 3 at s = 4 (12 top, 14-15 newest).
  CHECK(testing::kept(scope_after(spec, 4), 0, 0) ==
        std::vector<int32_t>{1, 3, 5, 7, 10, 11, 12, 14, 15});
  CHECK(testing::kept(scope_after(spec, 5), 0, 0) ==
        std::vector<int32_t>{1, 3, 5, 7, 10, 11, 12, 14, 15, 16});
  CHECK(testing::kept(scope_after(spec, 6), 0, 0) ==
        std::vector<int32_t>{1, 3, 5, 7, 10, 11, 12, 14, 16, 17});
}

TEST_CASE("scope discontinuous cuts only every delta + 1 over-size forwards", "[unit]") {
  const std::string spec =
      "scope:budget=6,window=2,kernel=1,mode=discontinuous,recent=2,delta=2,decode_window=3";
  // Over size from s = 4 on; s = 4 and 5 are left uncut, s = 6 cuts to 2 + 5 / 2 = 4.
  CHECK(testing::kept(scope_after(spec, 5), 0, 0) ==
        std::vector<int32_t>{1, 3, 5, 7, 10, 11, 12, 13, 14, 15, 16});
  CHECK(testing::kept(scope_after(spec, 6), 0, 0) ==
        std::vector<int32_t>{1, 3, 5, 7, 10, 11, 12, 14, 16, 17});
}

TEST_CASE("scope refuses a decode window not above recent and SnapKV's bad settings", "[unit]") {
  const KvShape shape{1, 1, kDim};
  CHECK_THROWS(make_cache("scope:decode_window=256,recent=256", shape));
  CHECK_THROWS(make_cache("scope:budget=16,window=32", shape));
  CHECK_THROWS(make_cache("scope:kernel=4", shape));
  CHECK_THROWS(make_cache("scope:mode=none", shape));
  CHECK_NOTHROW(make_cache("scope:ratio=0.5,decode_window=512", shape));
}
