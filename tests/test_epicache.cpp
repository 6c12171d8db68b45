// EpiCache's block-wise prefill (methods/epicache.cpp): after every block of the context,
// the block's last `window` queries score every stored key (softmax, max over the GQA
// group and rows) and each KV head keeps its top `budget`; a token dropped early never
// comes back, whatever later blocks would attend to.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "common/input_error.h"
#include "tests/cache_feed.h"
#include "tests/kept_positions.h"

using namespace kvbench;

namespace {

constexpr int32_t kHeads = 2;  // query heads over one KV head
constexpr int32_t kDim = 4;

void set(std::vector<float>& x, int64_t row, std::vector<float> values) {
  std::copy(values.begin(), values.end(), x.begin() + row * kDim);
}

// Eight tokens (scale 1/2). Block 1 (0-3): rows 2 and 3 query (2, 0, 0, 0) in both heads,
// logits k[0]: token 1 (2), 2 (1.5), 3 (1), token 0 (0, its key lies along axis 1). Block 2
// (4-7): rows 6 and 7 query (0, 2, 1, 0) in head 0 (token 0: logit 2, token 6: 1, token 7:
// 0.25) and (3, 0, 0, 0) in head 1 (token 1: 3, token 2: 2.25, token 3: 1.5).
testing::Chunk context() {
  testing::Chunk c;
  c.n = 8;
  c.k.assign(c.n * kDim, 0.f);
  c.v.assign(c.n * kDim, 1.f);
  c.q.assign(c.n * kHeads * kDim, 0.f);
  set(c.k, 0, {0, 2, 0, 0});
  set(c.k, 1, {2, 0, 0, 0});
  set(c.k, 2, {1.5f, 0, 0, 0});
  set(c.k, 3, {1, 0, 0, 0});
  set(c.k, 6, {0, 0, 2, 0});
  set(c.k, 7, {0, 0, 0.5f, 0});
  for (int64_t t : {2, 3}) {
    for (int h = 0; h < kHeads; ++h) set(c.q, t * kHeads + h, {2, 0, 0, 0});
  }
  for (int64_t t : {6, 7}) {
    set(c.q, t * kHeads + 0, {0, 2, 1, 0});
    set(c.q, t * kHeads + 1, {3, 0, 0, 0});
  }
  return c;
}

// Feeds the context in blocks of `block`, recording the tokens held after each; ends it.
KvCache fed(const std::string& spec, int64_t block, std::vector<int64_t>* sizes) {
  const KvShape shape{1, 1, kDim};
  KvCache cache = make_cache(spec, shape);
  const testing::Chunk c = context();
  for (int64_t first = 0; first < c.n; first += block) {
    testing::feed(cache, kHeads, testing::slice(c, first, block, shape, kHeads));
    sizes->push_back(cache.layer(0).n_tokens());
  }
  cache.end_context();
  return cache;
}

}  // namespace

TEST_CASE("epicache evicts after every block: a token dropped early stays dropped", "[unit]") {
  std::vector<int64_t> sizes;
  // Block 1 drops token 0 (the least attended); block 2's rows would want it back (head 0)
  // but see only tokens 1-7: head 1's max keeps 1 and 2, head 0's keeps 6.
  KvCache blocks = fed("epicache:budget=3,chunk=4,window=2", 4, &sizes);
  CHECK(testing::kept(blocks, 0, 0) == std::vector<int32_t>{1, 2, 6});
  CHECK(sizes == std::vector<int64_t>{3, 3});
  // One block of all eight: the last rows see token 0, whose head-0 weight beats token 6.
  sizes.clear();
  KvCache whole = fed("epicache:budget=3,chunk=8,window=2", 8, &sizes);
  CHECK(testing::kept(whole, 0, 0) == std::vector<int32_t>{0, 1, 2});
  // Later tokens are kept whole.
  testing::Chunk step;
  step.n = 1;
  step.k.assign(kDim, 0.f);
  step.v.assign(kDim, 1.f);
  step.q.assign(kHeads * kDim, 0.f);
  testing::decode_step(blocks, kHeads, step);
  CHECK(blocks.layer(0).n_tokens() == 4);
}

TEST_CASE("epicache's ratio is of the context read so far", "[unit]") {
  std::vector<int64_t> sizes;
  KvCache cache = fed("epicache:ratio=0.5,chunk=4,window=2", 4, &sizes);
  CHECK(sizes == std::vector<int64_t>{2, 4});  // half of 4, then half of 8
  CHECK(testing::kept(cache, 0, 0) == std::vector<int32_t>{1, 2, 6, 7});
}

TEST_CASE("epicache refuses what it cannot do", "[unit]") {
  CHECK_THROWS_AS(resolve_method_spec("epicache:chunk=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("epicache:chunk=513"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("epicache:window=0"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("epicache:budget=8,ratio=0.5"), InputError);
  CHECK_NOTHROW(resolve_method_spec("epicache:ratio=0.5,chunk=64,window=16"));
}
