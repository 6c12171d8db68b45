// A random KIVI attention problem shared by the CPU and CUDA KIVI kernel tests: fp32 KV
// quantized into blocks as the KIVI store holds them, a fp32 tail with NaN slack, queries
// spread over the stored positions, and random page selections.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/quantize.h"
#include "kernels/layouts.h"
#include "random_floats.h"

namespace kvbench::testing {

constexpr int32_t kKiviGroup = 32;

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
  int64_t tail_capacity = 0;

  explicit KiviProblem(const KiviCase& kc, uint32_t seed = 1) : c(kc) {
    const int H = c.n_kv_heads, D = c.head_dim, G = D / kKiviGroup;
    n_total = c.n_blocks * kKiviGroup + c.n_tail;
    k = random_floats(static_cast<size_t>(H * n_total * D), seed);
    v = random_floats(k.size(), seed + 1000);
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

    const int64_t code_bytes = int64_t{kKiviGroup} * D * c.bits / 8;
    const int64_t n_block_heads = c.n_blocks * H;
    k_codes.resize(static_cast<size_t>(n_block_heads * code_bytes));
    v_codes.resize(k_codes.size());
    k_scale.resize(static_cast<size_t>(n_block_heads * D));
    k_min.resize(k_scale.size());
    v_scale.resize(static_cast<size_t>(n_block_heads * kKiviGroup * G));
    v_min.resize(v_scale.size());
    block_positions.resize(static_cast<size_t>(n_block_heads * kKiviGroup));
    for (int64_t b = 0; b < c.n_blocks; ++b) {
      for (int h = 0; h < H; ++h) {
        const int64_t blk = b * H + h;
        const int64_t first = h * n_total + b * kKiviGroup;  // the block's slot 0 in k, v
        const QuantGroups keys{k_codes.data() + blk * code_bytes,
                               k_scale.data() + blk * D,
                               k_min.data() + blk * D,
                               D,
                               kKiviGroup,
                               c.bits};
        const QuantGroups values{v_codes.data() + blk * code_bytes,
                                 v_scale.data() + blk * kKiviGroup * G,
                                 v_min.data() + blk * kKiviGroup * G,
                                 int64_t{kKiviGroup} * G,
                                 kKiviGroup,
                                 c.bits};
        quantize_groups_cpu(k.data() + first * D, 1, D, keys);
        quantize_groups_cpu(v.data() + first * D, kKiviGroup, 1, values);
        std::copy(positions.begin() + first, positions.begin() + first + kKiviGroup,
                  block_positions.begin() + blk * kKiviGroup);
      }
    }
    tail_capacity = c.n_tail + 5;
    const int64_t capacity = tail_capacity;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    tail_k.assign(static_cast<size_t>(H * capacity * D), nan);
    tail_v.assign(tail_k.size(), nan);
    tail_positions.assign(static_cast<size_t>(H * capacity), -1);  // slack visible to all
    for (int h = 0; h < H; ++h) {
      for (int64_t t = 0; t < c.n_tail; ++t) {
        const int64_t src = h * n_total + c.n_blocks * kKiviGroup + t;
        std::copy(k.begin() + src * D, k.begin() + (src + 1) * D,
                  tail_k.begin() + (h * capacity + t) * D);
        std::copy(v.begin() + src * D, v.begin() + (src + 1) * D,
                  tail_v.begin() + (h * capacity + t) * D);
        tail_positions[h * capacity + t] = positions[src];
      }
    }
    const int32_t lo = 5;
    q_positions.resize(c.n_queries);
    for (int i = 0; i < c.n_queries; ++i) {
      q_positions[i] = lo + static_cast<int32_t>(int64_t{hi - lo} * (i + 1) / c.n_queries);
    }
    // Scores of a few units so the softmax is far from uniform.
    const testing::UniformFloat uni{-3.0f, 3.0f};
    q.resize(static_cast<size_t>(c.n_queries) * c.n_heads * D);
    for (auto& x : q) x = uni(rng);
  }

  // The layout over these arrays wherever they are (host, or device copies).
  KiviKv kv_at(const uint8_t* k_codes_at, const float* k_scale_at, const float* k_min_at,
               const uint8_t* v_codes_at, const float* v_scale_at, const float* v_min_at,
               const int32_t* block_positions_at, const float* tail_k_at, const float* tail_v_at,
               const int32_t* tail_positions_at) const {
    return KiviKv{k_codes_at,
                  k_scale_at,
                  k_min_at,
                  v_codes_at,
                  v_scale_at,
                  v_min_at,
                  block_positions_at,
                  c.n_blocks,
                  kKiviGroup,
                  c.bits,
                  DenseKv{tail_k_at, tail_v_at, tail_positions_at, c.n_kv_heads, c.head_dim,
                          tail_capacity, c.n_tail}};
  }
  KiviKv host_kv() const {
    return kv_at(k_codes.data(), k_scale.data(), k_min.data(), v_codes.data(), v_scale.data(),
                 v_min.data(), block_positions.data(), tail_k.data(), tail_v.data(),
                 tail_positions.data());
  }
  AttentionQuery query_at(const float* q_at, const int32_t* q_positions_at, float* out) const {
    return AttentionQuery{q_at,      q_positions_at,
                          out,       c.n_queries,
                          c.n_heads, 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  }

  std::vector<float> run(void (*fn)(const AttentionQuery&, const KiviKv&, const PageSelection*),
                         const PageSelection* pages = nullptr,
                         QueryRounding rounding = QueryRounding::None) const {
    std::vector<float> out(q.size(), 123.0f);
    AttentionQuery query = query_at(q.data(), q_positions.data(), out.data());
    query.rounding = rounding;
    fn(query, host_kv(), pages);
    return out;
  }

  // fp32 attention over the unquantized KV (every slot).
  std::vector<float> run_unquantized() const {
    std::vector<float> out(q.size(), 123.0f);
    attention_dense_cpu(
        query_at(q.data(), q_positions.data(), out.data()),
        DenseKv{k.data(), v.data(), positions.data(), c.n_kv_heads, c.head_dim, n_total, n_total});
    return out;
  }
};

// A random ascending subset of each head's pages (about half, or all of them), always holding
// the last page of head 0, different per head.
struct Pages {
  std::vector<int32_t> pages;
  PageSelection sel{};
  Pages(int n_kv_heads, int64_t n_total, int32_t page_tokens, uint32_t seed,
        bool all_pages = false) {
    const int32_t n_pages = static_cast<int32_t>((n_total + page_tokens - 1) / page_tokens);
    const int32_t n_selected = all_pages ? n_pages : std::max(1, n_pages / 2);
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

}  // namespace kvbench::testing
