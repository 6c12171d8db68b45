// attention_kivi_cpu (fused KIVI dequantize + attention) against its reference (dequantize every
// block, then the dense double-precision reference) over odd sizes, blocks/tail splits, head_dim
// 64/128, 2 and 4 bits, GQA, decode and prefill chunks, and Quest page selections; and the
// 4-bit result against fp32 attention on the unquantized KV.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attention_problem.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kivi_attention.h"
#include "kernels/cpu/quantize.h"
#include "random_floats.h"

using namespace kvbench;
using kvbench::testing::max_abs_diff;

namespace {

constexpr int32_t kGroup = 32;
constexpr float kTol = 2e-5f;  // kernel against reference: see the first test case

struct KiviCase {
  int n_heads, n_kv_heads, head_dim, bits;
  int64_t n_blocks, n_tail;
  int n_queries;
  bool shuffled = false;  // stored positions not ascending within each head
};

// Random fp32 KV (normal(0, 1)) for n_blocks * 32 + n_tail slots per KV head with gapped
// positions starting at 5, the blocks quantized with quantize_groups_cpu as KIVI stores them,
// the rest as the fp32 tail (NaN slack past n_tail, so a read past it shows). Query positions
// spread over the stored range: early queries see only a prefix.
struct KiviProblem {
  KiviCase c;
  int64_t n_total;
  std::vector<float> k, v;         // [n_kv_heads, n_total, head_dim] unquantized
  std::vector<int32_t> positions;  // [n_kv_heads, n_total]
  std::vector<uint8_t> k_codes, v_codes;
  std::vector<float> k_scale, k_min, v_scale, v_min, tail_k, tail_v;
  std::vector<int32_t> block_positions, tail_positions;
  std::vector<float> q;
  std::vector<int32_t> q_positions;
  KiviKv kv{};
  AttentionQuery query{};

  explicit KiviProblem(const KiviCase& kc, uint32_t seed = 1) : c(kc) {
    const int H = c.n_kv_heads, D = c.head_dim, G = D / kGroup;
    n_total = c.n_blocks * kGroup + c.n_tail;
    k = testing::random_floats(static_cast<size_t>(H * n_total * D), seed);
    v = testing::random_floats(k.size(), seed + 1000);
    std::mt19937 rng(seed);
    positions.resize(static_cast<size_t>(H * n_total));
    int32_t hi = 5;
    for (int h = 0; h < H; ++h) {
      int32_t* head = positions.data() + h * n_total;
      int32_t p = 5;
      for (int64_t t = 0; t < n_total; ++t) {
        head[t] = p;
        p += 1 + static_cast<int32_t>(rng() % 3);  // gaps of 0..2 evicted tokens
      }
      if (c.shuffled) std::shuffle(head, head + n_total, rng);
      hi = std::max(hi, p - 1);
    }

    const int64_t code_bytes = int64_t{kGroup} * D * c.bits / 8;
    const int64_t n_block_heads = c.n_blocks * H;
    k_codes.resize(static_cast<size_t>(n_block_heads * code_bytes));
    v_codes.resize(k_codes.size());
    k_scale.resize(static_cast<size_t>(n_block_heads * D));
    k_min.resize(k_scale.size());
    v_scale.resize(static_cast<size_t>(n_block_heads * kGroup * G));
    v_min.resize(v_scale.size());
    block_positions.resize(static_cast<size_t>(n_block_heads * kGroup));
    for (int64_t b = 0; b < c.n_blocks; ++b) {
      for (int h = 0; h < H; ++h) {
        const int64_t blk = b * H + h;
        const int64_t first = h * n_total + b * kGroup;  // the block's slot 0 in k, v
        const QuantGroups keys{k_codes.data() + blk * code_bytes,
                               k_scale.data() + blk * D,
                               k_min.data() + blk * D,
                               D,
                               kGroup,
                               c.bits};
        const QuantGroups values{v_codes.data() + blk * code_bytes,
                                 v_scale.data() + blk * kGroup * G,
                                 v_min.data() + blk * kGroup * G,
                                 int64_t{kGroup} * G,
                                 kGroup,
                                 c.bits};
        quantize_groups_cpu(k.data() + first * D, 1, D, keys);
        quantize_groups_cpu(v.data() + first * D, kGroup, 1, values);
        std::copy(positions.begin() + first, positions.begin() + first + kGroup,
                  block_positions.begin() + blk * kGroup);
      }
    }
    const int64_t capacity = c.n_tail + 5;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    tail_k.assign(static_cast<size_t>(H * capacity * D), nan);
    tail_v.assign(tail_k.size(), nan);
    tail_positions.assign(static_cast<size_t>(H * capacity), -1);  // slack visible to all
    for (int h = 0; h < H; ++h) {
      for (int64_t t = 0; t < c.n_tail; ++t) {
        const int64_t src = h * n_total + c.n_blocks * kGroup + t;
        std::copy(k.begin() + src * D, k.begin() + (src + 1) * D,
                  tail_k.begin() + (h * capacity + t) * D);
        std::copy(v.begin() + src * D, v.begin() + (src + 1) * D,
                  tail_v.begin() + (h * capacity + t) * D);
        tail_positions[h * capacity + t] = positions[src];
      }
    }
    const DenseKv tail{tail_k.data(), tail_v.data(), tail_positions.data(), H, D,
                       capacity,      c.n_tail};
    kv = KiviKv{k_codes.data(),
                k_scale.data(),
                k_min.data(),
                v_codes.data(),
                v_scale.data(),
                v_min.data(),
                block_positions.data(),
                c.n_blocks,
                kGroup,
                c.bits,
                tail};

    const int32_t lo = 5;
    q_positions.resize(c.n_queries);
    for (int i = 0; i < c.n_queries; ++i) {
      q_positions[i] = lo + static_cast<int32_t>(int64_t{hi - lo} * (i + 1) / c.n_queries);
    }
    // Scores of a few units so the softmax is far from uniform.
    std::uniform_real_distribution<float> uni(-3.0f, 3.0f);
    q.resize(static_cast<size_t>(c.n_queries) * c.n_heads * D);
    for (auto& x : q) x = uni(rng);
    query =
        AttentionQuery{q.data(),    q_positions.data(), nullptr,
                       c.n_queries, c.n_heads,          1.0f / std::sqrt(static_cast<float>(D))};
  }

  std::vector<float> run(void (*fn)(const AttentionQuery&, const KiviKv&, const PageSelection*),
                         const PageSelection* pages = nullptr) const {
    std::vector<float> out(q.size(), 123.0f);
    AttentionQuery qq = query;
    qq.out = out.data();
    fn(qq, kv, pages);
    return out;
  }

  // fp32 attention over the unquantized KV (every slot).
  std::vector<float> run_unquantized() const {
    std::vector<float> out(q.size(), 123.0f);
    AttentionQuery qq = query;
    qq.out = out.data();
    attention_dense_cpu(qq, DenseKv{k.data(), v.data(), positions.data(), c.n_kv_heads, c.head_dim,
                                    n_total, n_total});
    return out;
  }
};

// A random ascending subset of each head's pages (about half), always holding the last page
// of head 0, different per head.
struct Pages {
  std::vector<int32_t> pages;
  PageSelection sel{};
  Pages(int n_kv_heads, int64_t n_total, int32_t page_tokens, uint32_t seed) {
    const int32_t n_pages = static_cast<int32_t>((n_total + page_tokens - 1) / page_tokens);
    const int32_t n_selected = std::max(1, n_pages / 2);
    std::mt19937 rng(seed);
    for (int h = 0; h < n_kv_heads; ++h) {
      std::vector<int32_t> all(n_pages);
      for (int32_t p = 0; p < n_pages; ++p) all[p] = p;
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(n_selected);
      if (h == 0 && std::find(all.begin(), all.end(), n_pages - 1) == all.end()) {
        all[0] = n_pages - 1;
      }
      std::sort(all.begin(), all.end());
      pages.insert(pages.end(), all.begin(), all.end());
    }
    sel = PageSelection{pages.data(), n_selected, page_tokens};
  }
};

// Splits of a total length into (blocks, tail): 1, 15, 17 and 4097 slots, with and without
// blocks and tail.
const std::vector<std::pair<int64_t, int64_t>> kSplits = {
    {0, 1}, {0, 15}, {0, 17}, {1, 0}, {1, 15}, {2, 0}, {0, 4097}, {124, 129}, {128, 1}, {4, 0}};

}  // namespace

TEST_CASE("attention_kivi_cpu matches the dequantizing reference", "[unit]") {
  // 2e-5 absolute (observed <= 3e-6): outputs are convex combinations of dequantized values
  // (|v| < 6); both read the same codes, but the kernel folds the scales into q and p and sums
  // in fp32 (exp2 polynomial, online softmax, split-K merge) where the reference dequantizes
  // and accumulates in double, so they differ by a few fp32 ulps of the values.
  const float tol = kTol;
  for (int bits : {2, 4}) {
    for (int head_dim : {64, 128}) {
      for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{4, 4}}) {
        for (auto [n_blocks, n_tail] : kSplits) {
          for (int n_queries : {1, 7}) {
            const KiviProblem p(
                KiviCase{n_heads, n_kv_heads, head_dim, bits, n_blocks, n_tail, n_queries});
            INFO("bits " << bits << " head_dim " << head_dim << " heads " << n_heads << "/"
                         << n_kv_heads << " blocks " << n_blocks << " tail " << n_tail
                         << " queries " << n_queries);
            CHECK(max_abs_diff(p.run(attention_kivi_cpu), p.run(attention_kivi_reference)) <= tol);
          }
        }
      }
    }
  }
}

TEST_CASE("attention_kivi_cpu: decode sees every slot; prefill chunks of many rows", "[unit]") {
  // Long caches with split-K: one query of 9/3, 8/4 (3 and 2 rows per KV head: codes read into
  // registers) and 8/1 (8 rows: fp32 tiles), and a 64-query chunk (tiles). 2e-5 as above.
  for (int bits : {2, 4}) {
    for (auto [n_heads, n_kv_heads, n_queries] :
         {std::tuple{9, 3, 1}, std::tuple{8, 4, 1}, std::tuple{8, 1, 1}, std::tuple{9, 3, 64}}) {
      KiviProblem p(KiviCase{n_heads, n_kv_heads, 64, bits, 252, 128, n_queries}, 3);
      if (n_queries == 1) p.q_positions[0] = std::numeric_limits<int32_t>::max();
      INFO("bits " << bits << " heads " << n_heads << "/" << n_kv_heads << " queries "
                   << n_queries);
      CHECK(max_abs_diff(p.run(attention_kivi_cpu), p.run(attention_kivi_reference)) <= kTol);
    }
  }
}

TEST_CASE("attention_kivi_cpu handles unsorted stored positions", "[unit]") {
  // Masking by position inside a block must not assume ascending order. 2e-5 as above.
  for (int n_queries : {1, 7}) {
    const KiviProblem p(KiviCase{9, 3, 64, 2, 40, 33, n_queries, true}, 7);
    INFO("queries " << n_queries);
    CHECK(max_abs_diff(p.run(attention_kivi_cpu), p.run(attention_kivi_reference)) <= kTol);
  }
}

TEST_CASE("attention_kivi_cpu: a query that sees no slot outputs zeros", "[unit]") {
  // Exact: no slot is visible to query 0, so both give 0 by convention.
  KiviProblem p(KiviCase{4, 4, 128, 4, 3, 20, 7}, 5);
  p.q_positions[0] = 4;  // stored positions start at 5
  const auto got = p.run(attention_kivi_cpu);
  const auto expected = p.run(attention_kivi_reference);
  for (int e = 0; e < 4 * 128; ++e) {
    REQUIRE(got[e] == 0.0f);
    REQUIRE(expected[e] == 0.0f);
  }
  CHECK(max_abs_diff(got, expected) <= kTol);
}

TEST_CASE("attention_kivi_cpu reads only the selected pages", "[unit]") {
  // Pages of 16 (half a block), 24 and 64 slots: with 25 or 124 blocks some pages straddle the
  // block/tail boundary (and blocks), and the last page is partial. 2e-5 as above. The paged
  // result must also differ from the unpaged one, or the selection was ignored.
  for (int bits : {2, 4}) {
    for (int head_dim : {64, 128}) {
      for (auto [n_blocks, n_tail] :
           {std::pair<int64_t, int64_t>{25, 200}, {124, 129}, {0, 70}, {3, 0}}) {
        for (int32_t page_tokens : {16, 24, 64}) {
          for (int n_queries : {1, 7}) {
            const KiviProblem p(KiviCase{9, 3, head_dim, bits, n_blocks, n_tail, n_queries}, 11);
            const Pages pages(3, p.n_total, page_tokens, 17 + page_tokens);
            INFO("bits " << bits << " head_dim " << head_dim << " blocks " << n_blocks << " tail "
                         << n_tail << " page " << page_tokens << " queries " << n_queries);
            const auto got = p.run(attention_kivi_cpu, &pages.sel);
            CHECK(max_abs_diff(got, p.run(attention_kivi_reference, &pages.sel)) <= kTol);
            CHECK(max_abs_diff(got, p.run(attention_kivi_cpu)) > 1e-3f);
          }
        }
      }
    }
  }
}

TEST_CASE("attention_kivi_cpu: selecting every page equals no selection", "[unit]") {
  // 2e-6 absolute: the same slots are read, but a selection splits the work per KV head (no
  // selection: all heads per work item), so only the order of the fp32 sums differs.
  for (int32_t page_tokens : {16, 24, 64}) {
    for (int n_queries : {1, 7}) {
      const KiviProblem p(KiviCase{9, 3, 64, 2, 124, 129, n_queries}, 13);
      const int32_t n_pages = static_cast<int32_t>((p.n_total + page_tokens - 1) / page_tokens);
      std::vector<int32_t> all;
      for (int h = 0; h < 3; ++h) {
        for (int32_t i = 0; i < n_pages; ++i) all.push_back(i);
      }
      const PageSelection every{all.data(), n_pages, page_tokens};
      INFO("page " << page_tokens << " queries " << n_queries);
      CHECK(max_abs_diff(p.run(attention_kivi_cpu, &every), p.run(attention_kivi_cpu)) <= 2e-6f);
    }
  }
}

TEST_CASE("attention_kivi_cpu at 4 bits stays close to fp32 attention", "[unit]") {
  // A sanity bound on the quantization itself, over normal(0, 1) keys and values: 4 bits over
  // groups of 32 (step ~ range / 15 ~ 0.3) move each output by at most 0.25 (observed 0.17)
  // and by 0.025 on average (observed 0.012) against fp32 attention on the unquantized KV;
  // 2 bits move it at least twice as much on average (observed ~5x).
  for (int head_dim : {64, 128}) {
    for (int n_queries : {1, 7}) {
      const KiviProblem four(KiviCase{9, 3, head_dim, 4, 124, 129, n_queries}, 19);
      const KiviProblem two(KiviCase{9, 3, head_dim, 2, 124, 129, n_queries}, 19);
      const auto exact = four.run_unquantized();
      const auto got4 = four.run(attention_kivi_cpu);
      const auto got2 = two.run(attention_kivi_cpu);
      double mean4 = 0.0, mean2 = 0.0;
      for (size_t e = 0; e < exact.size(); ++e) {
        mean4 += std::fabs(got4[e] - exact[e]);
        mean2 += std::fabs(got2[e] - exact[e]);
      }
      mean4 /= static_cast<double>(exact.size());
      mean2 /= static_cast<double>(exact.size());
      INFO("head_dim " << head_dim << " queries " << n_queries << " mean 4-bit " << mean4
                       << " mean 2-bit " << mean2);
      CHECK(max_abs_diff(got4, exact) <= 0.25f);
      CHECK(mean4 <= 0.025);
      CHECK(mean2 > 2.0 * mean4);
    }
  }
}
