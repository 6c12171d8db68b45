// KIVI's store (methods/kivi.*): what it packs and when, the error its bit width allows,
// the bytes it really holds, and attention through the packed form.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "kernels/cpu/kivi_attention.h"
#include "methods/kivi.h"
#include "tests/cache_feed.h"

using namespace kvbench;

namespace {

constexpr int32_t kKvHeads = 3, kHeads = 9, kHeadDim = 64;

struct Tokens {
  std::vector<float> k, v;  // [n, n_kv_heads, head_dim]
  std::vector<int32_t> positions;
};

Tokens random_tokens(int64_t n, int32_t first_position, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  Tokens t;
  t.k.resize(n * kKvHeads * kHeadDim);
  t.v.resize(t.k.size());
  for (float& x : t.k) x = dist(rng);
  for (float& x : t.v) x = dist(rng);
  for (int64_t i = 0; i < n; ++i) t.positions.push_back(first_position + static_cast<int32_t>(i));
  return t;
}

// Largest |x - x'| over the group of 32 values x belongs to, divided by its quantization step:
// packing may move a value by at most half a step.
double worst_step_error(const std::vector<float>& original, const DenseKv& view, bool keys,
                        int64_t n_packed, int32_t bits) {
  double worst = 0;
  const int32_t levels = (1 << bits) - 1;
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int64_t b = 0; b < n_packed / 32; ++b) {
      for (int32_t g = 0; g < kHeadDim; ++g) {  // keys: channel g; values: token-major groups
        const auto at = [&](int32_t i) {
          const int64_t token = keys ? b * 32 + i : b * 32 + g / 2;
          const int32_t channel = keys ? g : (g % 2) * 32 + i;
          return std::pair<float, float>{
              original[(token * kKvHeads + h) * kHeadDim + channel],
              (keys ? view.k : view.v)[(h * view.capacity + token) * kHeadDim + channel]};
        };
        float lo = at(0).first, hi = lo;
        for (int32_t i = 1; i < 32; ++i) {
          lo = std::min(lo, at(i).first);
          hi = std::max(hi, at(i).first);
        }
        const double step = (hi - lo) / levels;
        for (int32_t i = 0; i < 32; ++i) {
          worst = std::max(worst, std::abs(at(i).first - at(i).second) / step);
        }
      }
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("kivi tail=block packs the blocks past its residual, the newest tokens fp32", "[unit]") {
  for (const int32_t bits : {2, 4}) {
    INFO("bits " << bits);
    KiviConfig config;
    config.bits = bits;
    config.tail = KiviTail::Block;
    KiviLayerKv store(kKvHeads, kHeadDim, config);
    const Tokens t = random_tokens(1000, 7, 3);
    store.append(t.k.data(), t.v.data(), t.positions.data(), 1000);
    CHECK(store.n_blocks() == 0);  // nothing packed before the forward ends
    store.settle();
    // (1000 - 128) / 32 = 27 blocks packed: between 128 and 159 newest tokens stay fp32.
    REQUIRE(store.n_blocks() == 27);
    REQUIRE(store.n_tokens() == 1000);
    const DenseKv view = store.view();
    CHECK(worst_step_error(t.k, view, true, 27 * 32, bits) <= 0.5 + 1e-3);
    CHECK(worst_step_error(t.v, view, false, 27 * 32, bits) <= 0.5 + 1e-3);
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int64_t i = 0; i < 1000; ++i) {
        REQUIRE(view.positions[h * view.capacity + i] == 7 + i);
        if (i < 27 * 32) continue;
        for (int32_t c = 0; c < kHeadDim; ++c) {  // the residual is exact
          REQUIRE(view.k[(h * view.capacity + i) * kHeadDim + c] ==
                  t.k[(i * kKvHeads + h) * kHeadDim + c]);
        }
      }
    }
    // One more token does not fill a block past the residual; 32 more do.
    const Tokens more = random_tokens(32, 1007, 4);
    store.append(more.k.data(), more.v.data(), more.positions.data(), 1);
    store.settle();
    CHECK(store.n_blocks() == 27);
    store.append(more.k.data() + kKvHeads * kHeadDim, more.v.data() + kKvHeads * kHeadDim,
                 more.positions.data() + 1, 31);
    store.settle();
    CHECK(store.n_blocks() == 28);
  }
}

TEST_CASE("kivi's tail is KIVI's: keys quantized R at a time, the newest R values fp32", "[unit]") {
  // KIVI's code (jy-yuan/KIVI models/llama_kivi.py): at prefill the first T - T mod R keys
  // and the first T - R values are quantized; in decode a key residual of R is quantized
  // whole, and the value leaving the newest R is quantized. Checked token by token as a
  // context of 1000 grows to 1300 one decode step at a time.
  for (const int32_t bits : {2, 4}) {
    INFO("bits " << bits);
    KiviConfig config;
    config.bits = bits;
    KiviLayerKv store(kKvHeads, kHeadDim, config);
    const Tokens t = random_tokens(1300, 0, 8);
    const int64_t row = kKvHeads * kHeadDim;
    store.append(t.k.data(), t.v.data(), t.positions.data(), 1000);
    for (int64_t n = 1000; n <= 1300; ++n) {
      if (n > 1000) store.append(&t.k[(n - 1) * row], &t.v[(n - 1) * row], &t.positions[n - 1], 1);
      store.settle();
      INFO("tokens " << n);
      const int64_t keys_fp32 = n % 128, values_fp32 = 128;
      REQUIRE(store.n_tokens() - store.n_blocks() * 32 <= 128 + 31);
      const DenseKv view = store.view();
      for (int32_t h = 0; h < kKvHeads; ++h) {
        for (int64_t i = 0; i < n; ++i) {
          REQUIRE(view.positions[h * view.capacity + i] == i);
          const float* k = view.k + (h * view.capacity + i) * kHeadDim;
          const float* v = view.v + (h * view.capacity + i) * kHeadDim;
          const bool k_exact = std::equal(k, k + kHeadDim, &t.k[i * row + h * kHeadDim]);
          const bool v_exact = std::equal(v, v + kHeadDim, &t.v[i * row + h * kHeadDim]);
          REQUIRE(k_exact == (i >= n - keys_fp32));
          REQUIRE(v_exact == (i >= n - values_fp32));
        }
      }
      if (n == 1000 || n == 1024 || n == 1300) {  // quantized rows: within half a step
        CHECK(worst_step_error(t.k, view, true, n - keys_fp32, bits) <= 0.5 + 1e-3);
        CHECK(worst_step_error(t.v, view, false, (n - values_fp32) / 32 * 32, bits) <= 0.5 + 1e-3);
      }
    }
  }
}

TEST_CASE("kivi 2-bit at 8K holds at most 0.2x the full cache plus its residual", "[unit]") {
  const int64_t n = 8192;
  const Tokens t = random_tokens(n, 0, 5);
  DenseLayerKv full(kKvHeads, kHeadDim);
  full.append(t.k.data(), t.v.data(), t.positions.data(), n);
  for (const int32_t bits : {2, 4}) {
    KiviConfig config;
    config.bits = bits;
    KiviLayerKv store(kKvHeads, kHeadDim, config);
    store.reserve(n);
    store.append(t.k.data(), t.v.data(), t.positions.data(), n);
    CHECK(store.bytes_resident() >= full.bytes_resident());  // the prefill itself is fp32
    store.settle();
    const int64_t tail = store.n_tokens() - store.n_blocks() * 32;
    // The residual as held: room for residual + 32 fp32 rows (the next block fills there).
    const int64_t residual_bytes = (config.residual + 32) * kKvHeads * (2 * kHeadDim * 4 + 4);
    const double ratio = static_cast<double>(store.bytes_resident() - residual_bytes) /
                         static_cast<double>(full.bytes_resident());
    INFO("bits " << bits << ": " << store.bytes_resident() << " bytes vs full "
                 << full.bytes_resident() << ", packed part " << ratio << "x, tail " << tail);
    CHECK(tail >= 128);
    CHECK(tail < 160);
    // Codes 2 x 16 bytes, scales and minimums 2 x 16 bytes, position 4, per token and head:
    // 68 of the 516 fp32 bytes (0.13x); 4-bit 100 (0.19x).
    CHECK(ratio <= (bits == 2 ? 0.2 : 0.3));
    CHECK(ratio >= (bits == 2 ? 0.12 : 0.18));
  }
}

TEST_CASE("kivi attends through the packed blocks, as the reference over what it holds", "[unit]") {
  KiviLayerKv store(kKvHeads, kHeadDim, KiviConfig{});
  const Tokens t = random_tokens(700, 0, 6);
  store.append(t.k.data(), t.v.data(), t.positions.data(), 700);
  store.settle();
  REQUIRE(store.n_blocks() > 0);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> q(3 * kHeads * kHeadDim), out(q.size()), expected(q.size());
  for (float& x : q) x = dist(rng);
  const std::vector<int32_t> q_positions = {100, 500, 699};  // early rows see only a prefix
  const AttentionQuery query{q.data(), q_positions.data(), out.data(), 3, kHeads, 0.125f};
  const int64_t bytes = store.attend(query, nullptr);
  attention_kivi_reference(
      AttentionQuery{q.data(), q_positions.data(), expected.data(), 3, kHeads, 0.125f},
      store.layout());
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == Approx(expected[i]).margin(1e-4));
  const int64_t tail = 700 - store.n_blocks() * 32;
  CHECK(bytes == kKvHeads * (store.n_blocks() * (kivi_block_bytes(kHeadDim, 32, 2) + 128) +
                             tail * (2 * kHeadDim * 4 + 4)));
}

TEST_CASE("kivi through the model: 4 bits stays closer to the full cache than 2 bits", "[unit]") {
  // head_dim 32: KIVI packs channels in groups of 32.
  const KvShape shape{3, 2, 32};
  std::mt19937 rng(11);
  const testing::Chunk context = testing::random_chunk(1000, shape, 4, rng);
  KvCache full = make_full_cache(shape);
  KvCache kivi4 = make_cache("kivi:bits=4", shape);
  KvCache kivi2 = make_cache("kivi:bits=2", shape);
  for (KvCache* cache : {&full, &kivi4, &kivi2}) {
    testing::feed(*cache, 4, context);
    cache->end_context();
  }
  // Bytes before anything looks at the stores (view() unpacks into a buffer of its own).
  CHECK(kivi2.stats().bytes_resident < kivi4.stats().bytes_resident);
  CHECK(kivi4.stats().bytes_resident < full.stats().bytes_resident / 2);
  const auto error = [&](const KvCache& cache) {
    double worst = 0;
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      const DenseKv a = full.layer(l).view(), b = cache.layer(l).view();
      REQUIRE(a.n_tokens == b.n_tokens);
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        for (int64_t i = 0; i < a.n_tokens * shape.head_dim; ++i) {
          worst = std::max<double>(
              worst, std::abs(a.k[h * a.capacity * 32 + i] - b.k[h * b.capacity * 32 + i]));
        }
      }
    }
    return worst;
  };
  const double e4 = error(kivi4), e2 = error(kivi2);
  INFO("max key error: 4-bit " << e4 << ", 2-bit " << e2);
  CHECK(e4 > 0);
  CHECK(e4 < 0.5 * e2);
  // A decode step reads the packed bytes, far fewer than the full cache's.
  for (KvCache* cache : {&full, &kivi2}) {
    testing::feed(*cache, 4, testing::random_chunk(1, shape, 4, rng));
  }
  // 864 tokens packed, 137 in the fp32 residual.
  CHECK(kivi2.stats().bytes_read_last_forward < full.stats().bytes_read_last_forward / 2);
}

TEST_CASE("a kivi clone decodes without touching the original", "[unit]") {
  const KvShape shape{2, 2, 32};
  std::mt19937 rng(12);
  KvCache a = make_cache("kivi:bits=2,residual=32", shape);
  testing::feed(a, 4, testing::random_chunk(300, shape, 4, rng));
  a.end_context();
  const DenseKv before = a.layer(1).view();
  const std::vector<float> k_before(before.k, before.k + 2 * before.capacity * 32);
  const int64_t bytes = a.stats().bytes_resident;
  KvCache branch = a.clone();
  for (int i = 0; i < 40; ++i) testing::feed(branch, 4, testing::random_chunk(1, shape, 4, rng));
  CHECK(branch.stats().tokens_per_layer[0] == 340);
  CHECK(a.stats().tokens_per_layer[0] == 300);
  CHECK(a.stats().bytes_resident == bytes);
  const DenseKv after = a.layer(1).view();
  CHECK(std::vector<float>(after.k, after.k + 2 * after.capacity * 32) == k_before);
}

namespace {

// Every layer of a KIVI cache holds its tokens in position order with the newest fp32:
// every packed position comes before every tail position, the tail ascends, and it holds
// at least min(residual, tokens kept) tokens. Returns the tail's positions of layer 0.
std::vector<int32_t> check_newest_in_tail(const KvCache& cache, int64_t residual) {
  std::vector<int32_t> tail_of_layer0;
  for (int32_t l = 0; l < cache.shape().n_layers; ++l) {
    const auto& store = dynamic_cast<const KiviLayerKv&>(cache.layer(l));
    const DenseKv kv = store.view();
    const int64_t packed = store.n_blocks() * 32;
    INFO("layer " << l << ": " << store.n_blocks() << " blocks, " << kv.n_tokens << " tokens");
    CHECK(kv.n_tokens - packed >= std::min(residual, kv.n_tokens));
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      const int32_t* pos = kv.positions + h * kv.capacity;
      const int32_t newest_packed = packed > 0 ? *std::max_element(pos, pos + packed) : -1;
      for (int64_t t = packed; t < kv.n_tokens; ++t) {
        REQUIRE(pos[t] > newest_packed);
        if (t > packed) REQUIRE(pos[t] > pos[t - 1]);
        if (l == 0 && h == 0) tail_of_layer0.push_back(pos[t]);
      }
    }
  }
  return tail_of_layer0;
}

}  // namespace

TEST_CASE("an eviction in front of kivi leaves the newest tokens in the fp32 tail", "[unit]") {
  // A 2048-token context, compressed to 512, then 64 decode steps that each evict one token:
  // the new tokens must enter the fp32 residual, never go straight to 2 bits.
  const KvShape shape{2, 2, 32};
  for (const std::string policy : {"h2o:budget=512", "streamingllm:budget=512",
                                   "snapkv:budget=512", "tova:budget=512"}) {
    INFO(policy);
    std::mt19937 rng(21);
    KvCache cache = make_cache(policy + "+kivi:bits=2", shape);
    const testing::Chunk context = testing::random_chunk(2048, shape, 4, rng);
    for (int64_t from = 0; from < 2048; from += 512) {
      testing::feed(cache, 4, testing::slice(context, from, 512, shape, 4));
    }
    cache.end_context();
    // TOVA keeps no recent window (it may drop a new token); the others keep every new one.
    const bool keeps_recent = policy.rfind("tova", 0) != 0;
    std::vector<int32_t> tail = check_newest_in_tail(cache, 128);
    if (keeps_recent) CHECK(tail.back() == 2047);
    for (int i = 0; i < 64; ++i) {
      testing::decode_step(cache, 4, testing::random_chunk(1, shape, 4, rng));
    }
    tail = check_newest_in_tail(cache, 128);
    for (int32_t p = 2048; p < 2048 + 64 && keeps_recent; ++p) {
      REQUIRE(std::find(tail.begin(), tail.end(), p) != tail.end());
    }
  }
}

TEST_CASE("plain kivi attends over its context in fp32, as KIVI's prefill", "[unit]") {
  // A 1024-token context fed as two chunks: the second attends over the first unpacked, as
  // the full cache does; packing happens once the context has ended.
  const KvShape shape{2, 2, 32};
  std::mt19937 rng(22);
  const testing::Chunk context = testing::random_chunk(1024, shape, 4, rng);
  KvCache full = make_full_cache(shape);
  KvCache kivi = make_cache("kivi:bits=2", shape);
  for (int64_t from = 0; from < 1024; from += 512) {
    const testing::Chunk c = testing::slice(context, from, 512, shape, 4);
    REQUIRE(testing::feed(kivi, 4, c) == testing::feed(full, 4, c));
  }
  CHECK(dynamic_cast<const KiviLayerKv&>(kivi.layer(0)).n_blocks() == 0);
  kivi.end_context();
  CHECK(dynamic_cast<const KiviLayerKv&>(kivi.layer(0)).n_blocks() == (1024 - 128) / 32);
  check_newest_in_tail(kivi, 128);
}

// Found by the CUDA emulation (a tail row past the tokens read as its poison): with residual 0
// every key counts as quantized, but keys round a channel over a whole group of rows.
TEST_CASE("kivi with residual 0 rounds only whole groups of tail keys", "[unit]") {
  KiviConfig config;
  config.residual = 0;
  config.group = 32;
  // 65 tokens, 64 packed: the one tail key waits for its group; its value rounds alone.
  const TailRounding r = kivi_tail_rounding(config, 65, 64, 0, 0);
  CHECK(r.keys_to == 0);
  CHECK(r.values_to == 1);
  CHECK(kivi_tail_rounding(config, 96, 64, 0, 0).keys_to == 32);
  config.residual = 128;  // whole groups already: unchanged
  CHECK(kivi_tail_rounding(config, 300, 128, 0, 0).keys_to == 256 - 128);
}
