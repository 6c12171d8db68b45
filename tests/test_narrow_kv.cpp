// The narrow stores (cache/narrow_kv.*, kernels/cpu/narrow.*): conversions rounded to
// nearest even, each element's round-trip error within its format's bound, attention that
// converts as it reads equal to attention over the decoded values, and bytes exact.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "cache/narrow_kv.h"
#include "cache/registry.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/layer_ops.h"
#include "kernels/cpu/narrow.h"
#include "tests/attention_problem.h"
#include "tests/cache_feed.h"

using namespace kvbench;

namespace {

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

const KvElement kElements[] = {KvElement::F16, KvElement::BF16, KvElement::F8E4M3};

const char* name_of(KvElement e) {
  return e == KvElement::F16 ? "fp16" : e == KvElement::BF16 ? "bf16" : "fp8";
}

// A NarrowKv holding the problem's rows (capacity and positions as the problem's), and
// the problem's DenseKv over the decoded values.
struct NarrowProblem {
  std::vector<uint8_t> k, v;
  std::vector<float> k_scale, v_scale, k_wide, v_wide;
  NarrowKv narrow{};
  DenseKv wide{};

  NarrowProblem(const testing::AttentionProblem& p, KvElement e) {
    const DenseKv& kv = p.kv;
    const int64_t rows = kv.n_kv_heads * kv.capacity;
    const int64_t bytes = kv.head_dim * kv_element_bytes(e);
    k.resize(rows * bytes);
    v.resize(k.size());
    k_scale.assign(rows, 1.0f);
    v_scale.assign(rows, 1.0f);
    k_wide.assign(p.k.size(), std::nanf(""));
    v_wide.assign(p.v.size(), std::nanf(""));
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      const int64_t row = h * kv.capacity;
      encode_kv_rows(e, kv.k + row * kv.head_dim, kv.head_dim, kv.n_tokens, kv.head_dim,
                     &k[row * bytes], &k_scale[row]);
      encode_kv_rows(e, kv.v + row * kv.head_dim, kv.head_dim, kv.n_tokens, kv.head_dim,
                     &v[row * bytes], &v_scale[row]);
      decode_kv_rows(e, &k[row * bytes], &k_scale[row], kv.n_tokens, kv.head_dim,
                     &k_wide[row * kv.head_dim]);
      decode_kv_rows(e, &v[row * bytes], &v_scale[row], kv.n_tokens, kv.head_dim,
                     &v_wide[row * kv.head_dim]);
    }
    const bool scaled = e == KvElement::F8E4M3;
    narrow = NarrowKv{k.data(),     v.data(),      scaled ? k_scale.data() : nullptr,
                      scaled ? v_scale.data() : nullptr, kv.positions, e, kv.n_kv_heads,
                      kv.head_dim,  kv.capacity,   kv.n_tokens};
    wide = DenseKv{k_wide.data(), v_wide.data(), kv.positions, kv.n_kv_heads,
                   kv.head_dim,   kv.capacity,   kv.n_tokens};
  }
};

}  // namespace

TEST_CASE("fp16 conversion rounds to nearest even and keeps every half value", "[unit]") {
  CHECK(float_to_half_bits(1.0f) == 0x3c00);
  CHECK(float_to_half_bits(1.0f + 0x1p-11f) == 0x3c00);         // tie: to even
  CHECK(float_to_half_bits(1.0f + 3 * 0x1p-11f) == 0x3c02);     // tie: to even, upwards
  CHECK(float_to_half_bits(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);  // past the tie
  CHECK(float_to_half_bits(65504.0f) == 0x7bff);
  CHECK(float_to_half_bits(65519.0f) == 0x7bff);
  CHECK(float_to_half_bits(65520.0f) == 0x7c00);  // the tie rounds to infinity
  CHECK(float_to_half_bits(-1e9f) == 0xfc00);
  CHECK(float_to_half_bits(0x1p-24f) == 0x0001);   // smallest subnormal
  CHECK(float_to_half_bits(0x1p-25f) == 0x0000);   // tie to even: zero
  CHECK(float_to_half_bits(0x1.8p-25f) == 0x0001);
  CHECK(float_to_half_bits(-0.0f) == 0x8000);
  CHECK(std::isnan(half_to_float(float_to_half_bits(std::nanf("")))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float x = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(x)) continue;
    REQUIRE(float_to_half_bits(x) == h);
  }
  // Against the hardware conversion where the build has it (F16C): every float pattern of
  // a sample across the whole range.
  std::mt19937 rng(3);
  for (int i = 0; i < 1000000; ++i) {
    const float x = from_bits(rng());
    if (std::isnan(x)) continue;
    const uint16_t h = float_to_half_bits(x);
    const float back = half_to_float(h);
    if (std::fabs(x) < 65504.0f) {
      // Nearest: no half value lies closer to x than the one chosen.
      const float next = half_to_float(static_cast<uint16_t>(h + 1));
      const float prev = half_to_float(static_cast<uint16_t>(h - 1));
      if (std::isfinite(next)) REQUIRE(std::fabs(back - x) <= std::fabs(next - x));
      if ((h & 0x7fff) != 0) REQUIRE(std::fabs(back - x) <= std::fabs(prev - x));
    }
  }
}

TEST_CASE("e4m3 conversion rounds to nearest even, saturates at 448, keeps every code",
          "[unit]") {
  CHECK(float_to_e4m3(1.0f) == 0x38);
  CHECK(float_to_e4m3(1.0625f) == 0x38);  // tie between 1 and 1.125: even mantissa
  CHECK(float_to_e4m3(1.1875f) == 0x3a);  // tie between 1.125 and 1.25: even (1.25)
  CHECK(float_to_e4m3(448.0f) == 0x7e);
  CHECK(float_to_e4m3(460.0f) == 0x7e);
  CHECK(float_to_e4m3(1e30f) == 0x7e);
  CHECK(float_to_e4m3(-INFINITY) == 0xfe);
  CHECK(float_to_e4m3(0x1p-9f) == 0x01);  // smallest subnormal
  CHECK(float_to_e4m3(0x1p-10f) == 0x00);  // tie to even: zero
  CHECK(float_to_e4m3(0x1.fp-7f) == 0x08);  // rounds up into the smallest normal, 2^-6
  CHECK(e4m3_to_float(0x7e) == 448.0f);
  CHECK(e4m3_to_float(0x08) == 0x1p-6f);
  CHECK(std::isnan(e4m3_to_float(0x7f)));
  CHECK(std::isnan(e4m3_to_float(0xff)));
  for (int c = 0; c < 256; ++c) {
    const float x = e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(x)) continue;
    REQUIRE(float_to_e4m3(x) == c);
    // Halfway to the next code up rounds to the even one of the two.
    if ((c & 0x7f) < 0x7e) {
      const float up = e4m3_to_float(static_cast<uint8_t>(c + 1));
      const uint8_t tie = float_to_e4m3((x + up) / 2);
      REQUIRE(tie == ((c & 1) ? c + 1 : c));
    }
  }
}

TEST_CASE("narrow rows round-trip within their format's bound", "[unit]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int32_t dim = 64;
  std::vector<float> rows(50 * dim);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = dist(rng) * (i % 7 == 0 ? 30.f : 1.f);
  for (int32_t d = 0; d < dim; ++d) rows[3 * dim + d] = 0.0f;  // a zero row: scale 1, exact
  for (const KvElement e : kElements) {
    INFO(name_of(e));
    std::vector<uint8_t> packed(rows.size() * kv_element_bytes(e));
    std::vector<float> scale(50), back(rows.size());
    encode_kv_rows(e, rows.data(), dim, 50, dim, packed.data(), scale.data());
    decode_kv_rows(e, packed.data(), scale.data(), 50, dim, back.data());
    for (int64_t r = 0; r < 50; ++r) {
      for (int32_t d = 0; d < dim; ++d) {
        const float x = rows[r * dim + d], y = back[r * dim + d];
        // Half an ulp: 2^-11 relative (fp16), 2^-8 (bf16), 2^-4 of the value or half the
        // subnormal step 2^-10 of the row's scale (fp8).
        const double bound = e == KvElement::F16    ? std::ldexp(std::fabs(x), -11)
                             : e == KvElement::BF16 ? std::ldexp(std::fabs(x), -8)
                                                    : std::max(std::ldexp(std::fabs(x), -4),
                                                               std::ldexp(scale[r], -10));
        REQUIRE(std::fabs(x - y) <= bound * (1 + 1e-6));
      }
    }
    CHECK(back[3 * dim] == 0.0f);
    if (e == KvElement::F8E4M3) {
      CHECK(scale[3] == 1.0f);
      // The row's largest magnitude maps to 448 exactly.
      float amax = 0;
      for (int32_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(rows[d]));
      CHECK(scale[0] == amax / 448.0f);
    }
  }
}

TEST_CASE("attention over narrow rows equals attention over their values, bit for bit",
          "[unit]") {
  const testing::Case cases[] = {
      {9, 3, 64, 700, 1},     // decode, GQA, split-K
      {9, 3, 64, 300, 40},    // prefill chunk
      {4, 4, 32, 1500, 3, true},  // shuffled positions (after eviction)
  };
  for (const testing::Case& c : cases) {
    testing::AttentionProblem p(c, 17);
    for (const KvElement e : kElements) {
      INFO(name_of(e) << " n_tokens " << c.n_tokens << " queries " << c.n_queries);
      const NarrowProblem n(p, e);
      std::vector<float> got(p.q.size(), 7.f), want(p.q.size(), 9.f);
      AttentionQuery q = p.query;
      q.out = got.data();
      attention_narrow_cpu(q, n.narrow, nullptr);
      q.out = want.data();
      attention_dense_cpu(q, n.wide);
      REQUIRE(got == want);

      // Pages of 16: every other one, odd or even by head.
      const int32_t page_tokens = 16;
      const int32_t n_pages = static_cast<int32_t>((c.n_tokens + page_tokens - 1) / page_tokens);
      const int32_t n_selected = n_pages / 2;
      std::vector<int32_t> pages;
      for (int32_t h = 0; h < c.n_kv_heads; ++h) {
        for (int32_t i = 0; i < n_selected; ++i) pages.push_back(2 * i + h % 2);
      }
      const PageSelection sel{pages.data(), n_selected, page_tokens};
      q.out = got.data();
      attention_narrow_cpu(q, n.narrow, &sel);
      q.out = want.data();
      attention_pages_cpu(q, n.wide, sel);
      REQUIRE(got == want);
    }
  }
}

TEST_CASE("a narrow store holds its bytes exactly and retains as the dense store", "[unit]") {
  const KvShape shape{1, 3, 64};
  std::mt19937 rng(21);
  const testing::Chunk context = testing::random_chunk(300, shape, 9, rng);
  for (const KvElement e : kElements) {
    INFO(name_of(e));
    NarrowLayerKv narrow(shape.n_kv_heads, shape.head_dim, e);
    DenseLayerKv dense(shape.n_kv_heads, shape.head_dim);
    std::vector<int32_t> positions(context.n);
    for (int64_t i = 0; i < context.n; ++i) positions[i] = static_cast<int32_t>(i);
    narrow.reserve(context.n);
    narrow.append(context.k.data(), context.v.data(), positions.data(), context.n);
    // The dense store holds the narrow store's values: the same plan must leave both alike.
    const DenseKv values = narrow.view();
    std::vector<float> k(context.n * shape.n_kv_heads * shape.head_dim), v(k.size());
    for (int64_t t = 0; t < context.n; ++t) {
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        std::memcpy(&k[(t * shape.n_kv_heads + h) * shape.head_dim],
                    values.k + (h * values.capacity + t) * shape.head_dim,
                    shape.head_dim * sizeof(float));
        std::memcpy(&v[(t * shape.n_kv_heads + h) * shape.head_dim],
                    values.v + (h * values.capacity + t) * shape.head_dim,
                    shape.head_dim * sizeof(float));
      }
    }
    dense.reserve(context.n);
    dense.append(k.data(), v.data(), positions.data(), context.n);

    const int64_t row = narrow_row_bytes(e, shape.head_dim);
    CHECK(narrow.bytes_resident() == shape.n_kv_heads * 300 * (2 * row + 4));
    CHECK(row == (e == KvElement::F8E4M3 ? 64 + 4 : 128));

    // A compression (every third token, different per head), then a one-token eviction.
    for (const int64_t step : {0, 1}) {
      RetainPlan plan;
      const int64_t n = narrow.n_tokens();
      plan.n_keep = step == 0 ? 90 : n - 1;
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        for (int64_t t = 0, kept = 0; t < n && kept < plan.n_keep; ++t) {
          if (step == 0 ? (t + h) % 3 != 0 : t == 5 + h) continue;
          plan.slots.push_back(static_cast<int32_t>(t));
          ++kept;
        }
      }
      REQUIRE(static_cast<int64_t>(plan.slots.size()) == plan.n_keep * shape.n_kv_heads);
      RetainPlan dense_plan = plan;
      narrow.retain(plan);
      dense.retain(dense_plan);
      REQUIRE(plan.slots == dense_plan.slots);
      const DenseKv a = narrow.view(), b = dense.view();
      REQUIRE(a.n_tokens == b.n_tokens);
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        for (int64_t t = 0; t < a.n_tokens; ++t) {
          REQUIRE(a.positions[h * a.capacity + t] == b.positions[h * b.capacity + t]);
          for (int32_t d = 0; d < shape.head_dim; ++d) {
            const int64_t ia = (h * a.capacity + t) * shape.head_dim + d;
            const int64_t ib = (h * b.capacity + t) * shape.head_dim + d;
            REQUIRE(a.k[ia] == b.k[ib]);
            REQUIRE(a.v[ia] == b.v[ib]);
          }
        }
      }
      narrow.settle();
      // Bytes follow the capacity the dense store's rule keeps, at the narrow row size.
      CHECK(narrow.capacity() == dense.capacity());
      CHECK(narrow.bytes_resident() == shape.n_kv_heads * narrow.capacity() * (2 * row + 4));
    }
  }
}

TEST_CASE("narrow caches through the feed: 16-bit close to fp32, fp8 further, half the bytes",
          "[unit]") {
  const KvShape shape{3, 2, 64};
  const int32_t n_heads = 6;
  std::mt19937 rng(8);
  const testing::Chunk context = testing::random_chunk(400, shape, n_heads, rng);
  const testing::Chunk step = testing::random_chunk(1, shape, n_heads, rng);
  KvCache full = make_full_cache(shape);
  full.reserve(401);  // capacities exact, so bytes are the tokens'
  std::vector<float> want;
  testing::feed(full, n_heads, context);
  full.end_context();
  want = testing::decode_step(full, n_heads, step);
  const auto error = [&](const std::string& spec, CacheStats* stats) {
    KvCache cache = make_cache(spec, shape);
    cache.reserve(401);
    testing::feed(cache, n_heads, context);
    cache.end_context();
    const std::vector<float> got = testing::decode_step(cache, n_heads, step);
    *stats = cache.stats();
    return static_cast<double>(testing::max_abs_diff(got, want));
  };
  CacheStats s16, sbf, s8;
  const double e16 = error("fp16", &s16), ebf = error("bf16", &sbf), e8 = error("fp8", &s8);
  INFO("max |attention out - fp32|: fp16 " << e16 << ", bf16 " << ebf << ", fp8 " << e8);
  CHECK(e16 > 0);
  CHECK(e16 < 2e-3);
  CHECK(ebf < 1.5e-2);
  CHECK(e16 < ebf);
  CHECK(ebf < e8);
  CHECK(e8 < 0.15);
  const int64_t full_bytes = full.stats().bytes_resident;
  const int64_t tokens = 401 * shape.n_kv_heads * shape.n_layers;
  CHECK(full_bytes == tokens * (2 * 64 * 4 + 4));
  CHECK(s16.bytes_resident == tokens * (2 * 64 * 2 + 4));
  CHECK(sbf.bytes_resident == s16.bytes_resident);
  CHECK(s8.bytes_resident == tokens * (2 * (64 + 4) + 4));
  // A decode step reads the narrow bytes.
  CHECK(sbf.bytes_read_last_forward == s16.bytes_resident);
}

TEST_CASE("snapkv+bf16 keeps snapkv's tokens in 16 bits; a clone is independent", "[unit]") {
  const KvShape shape{2, 2, 64};
  const int32_t n_heads = 4;
  std::mt19937 rng(9);
  const testing::Chunk context = testing::random_chunk(500, shape, n_heads, rng);
  KvCache alone = make_cache("snapkv:budget=128", shape);
  KvCache narrow = make_cache("snapkv:budget=128+bf16", shape);
  for (KvCache* c : {&alone, &narrow}) {
    testing::feed(*c, n_heads, context);
    c->end_context();
  }
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    const DenseKv a = alone.layer(l).view(), b = narrow.layer(l).view();
    REQUIRE(a.n_tokens == 128);
    REQUIRE(b.n_tokens == 128);
    // The same kept set (snapkv scores the rounded keys, which may reorder near-ties: allow
    // a few), rounded values.
    int64_t same = 0;
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      for (int64_t t = 0; t < 128; ++t) same += a.positions[h * a.capacity + t] == b.positions[h * b.capacity + t];
    }
    CHECK(same >= 0.95 * 128 * shape.n_kv_heads);
  }
  CHECK(narrow.stats().bytes_resident < 0.55 * alone.stats().bytes_resident);

  KvCache twin = make_cache("snapkv:budget=128+bf16", shape);
  testing::feed(twin, n_heads, context);
  twin.end_context();
  KvCache branch = narrow.clone();
  for (int i = 0; i < 3; ++i) testing::decode_step(branch, n_heads, testing::random_chunk(1, shape, n_heads, rng));
  const testing::Chunk next = testing::random_chunk(1, shape, n_heads, rng);
  REQUIRE(testing::decode_step(narrow, n_heads, next) == testing::decode_step(twin, n_heads, next));
}
