// The CUDA twins of the KIVI, Quest and merging kernels against their CPU references on the same
// inputs, over odd sizes (lengths 1, 15, 17, 4097; head_dim 64 and 128; bits 2 and 4). Without
// a CUDA device every case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "attention_problem.h"
#include "cuda_device.h"
#include "device_problem.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kivi_attention.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/quest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/kivi_attention.h"
#include "kernels/cuda/merge.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/quest.h"
#include "kivi_problem.h"
#include "page_picks.h"
#include "random_floats.h"

namespace {

using kvbench::AttentionQuery;
using kvbench::DenseKv;
using kvbench::KiviKv;
using kvbench::PageBounds;
using kvbench::PageSelection;
using kvbench::QuantGroups;
using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;
using kvbench::testing::Device;
using kvbench::testing::DeviceProblem;
using kvbench::testing::KiviCase;
using kvbench::testing::KiviProblem;
using kvbench::testing::max_abs_diff;
using kvbench::testing::Pages;
using kvbench::testing::pages_of;
using kvbench::testing::Pick;
using kvbench::testing::pick_pages;
using kvbench::testing::random_floats;
using kvbench::testing::require_device;

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---- Quantization -----------------------------------------------------------------------------

// n_groups groups of group_size normal(0, 1) values, laid out as keys ([group_size, n_groups]:
// group stride 1) or values ([n_groups, group_size]: element stride 1); every fifth group on a
// grid of half steps (ties for the rounding), every seventh constant (scale 0).
struct QuantProblem {
  int64_t n_groups, group_stride, element_stride;
  int32_t group_size, bits;
  std::vector<float> x;

  QuantProblem(int64_t groups, int32_t size, int32_t b, bool keys, uint32_t seed)
      : n_groups(groups),
        group_stride(keys ? 1 : size),
        element_stride(keys ? groups : 1),
        group_size(size),
        bits(b),
        x(random_floats(static_cast<size_t>(groups * size), seed)) {
    const int levels = (1 << bits) - 1;
    for (int64_t g = 0; g < n_groups; ++g) {
      for (int32_t i = 0; i < group_size; ++i) {
        float& v = x[g * group_stride + i * element_stride];
        if (g % 7 == 3) v = 0.25f;
        if (g % 5 == 1) v = i == 0 ? 0.0f : i == 1 ? float(levels) : 0.5f * (i % (2 * levels));
      }
    }
  }

  struct Packed {
    std::vector<uint8_t> packed;
    std::vector<float> scale, min;
  };

  Packed empty() const {
    return Packed{std::vector<uint8_t>(static_cast<size_t>(n_groups * group_size * bits / 8), 0xAB),
                  std::vector<float>(n_groups, -7.0f), std::vector<float>(n_groups, -7.0f)};
  }

  QuantGroups groups(uint8_t* packed, float* scale, float* min) const {
    return QuantGroups{packed, scale, min, n_groups, group_size, bits};
  }
};

TEST_CASE("quantize_groups_cuda is bit-identical to the CPU and dequantize one rounding apart",
          "[gpu]") {
  require_device();
  for (int32_t bits : {2, 4}) {
    for (int32_t group_size : {32, 12}) {
      for (int64_t n_groups : {1, 15, 17, 4097}) {
        for (bool keys : {true, false}) {
          const QuantProblem p(n_groups, group_size, bits, keys, static_cast<uint32_t>(n_groups));
          INFO("bits " << bits << " group_size " << group_size << " groups " << n_groups
                       << (keys ? " keys" : " values"));
          auto reference = p.empty(), cpu = p.empty();
          kvbench::quantize_groups_reference(
              p.x.data(), p.group_stride, p.element_stride,
              p.groups(reference.packed.data(), reference.scale.data(), reference.min.data()));
          kvbench::quantize_groups_cpu(
              p.x.data(), p.group_stride, p.element_stride,
              p.groups(cpu.packed.data(), cpu.scale.data(), cpu.min.data()));
          const auto init = p.empty();
          Device<float> x(p.x), scale(init.scale), min(init.min);
          Device<uint8_t> packed(init.packed);
          const QuantGroups q = p.groups(packed.get(), scale.get(), min.get());
          kvbench::quantize_groups_cuda(x.get(), p.group_stride, p.element_stride, q, nullptr);
          // Exact: codes, scales and minimums bit for bit, against the reference and the kernel.
          const auto got_packed = packed.host();
          const auto got_scale = scale.host(), got_min = min.host();
          CHECK(bitwise_equal(got_packed, reference.packed));
          CHECK(bitwise_equal(got_scale, reference.scale));
          CHECK(bitwise_equal(got_min, reference.min));
          CHECK(bitwise_equal(got_packed, cpu.packed));
          CHECK(bitwise_equal(got_scale, cpu.scale));
          CHECK(bitwise_equal(got_min, cpu.min));

          // Dequantize the same codes: min + code * scale as one fma on both, bit for bit (a
          // group quantized again from dequantized values must get the same codes).
          std::vector<float> expected(p.x.size(), 0.0f);
          kvbench::dequantize_groups_reference(
              p.groups(reference.packed.data(), reference.scale.data(), reference.min.data()),
              expected.data(), p.group_stride, p.element_stride);
          Device<float> back(std::vector<float>(p.x.size(), 99.0f));
          kvbench::dequantize_groups_cuda(q, back.get(), p.group_stride, p.element_stride, nullptr);
          const auto got = back.host();
          for (int64_t g = 0; g < n_groups; ++g) {
            for (int32_t i = 0; i < group_size; ++i) {
              const int64_t at = g * p.group_stride + i * p.element_stride;
              REQUIRE(std::memcmp(&got[at], &expected[at], sizeof(float)) == 0);
            }
          }
        }
      }
    }
  }
}

// ---- KIVI attention ---------------------------------------------------------------------------

// The device copies of a KIVI problem, attended by the CUDA kernel. pages: a host selection
// (nullptr for none); its page list is copied to the device.
// pages: host selection (nullptr for none); its page list is copied to the device.
std::vector<float> run_kivi_cuda(const KiviProblem& p, const PageSelection* pages) {
  Device<uint8_t> kc(p.k_codes), vc(p.v_codes);
  Device<float> ks(p.k_scale), km(p.k_min), vs(p.v_scale), vm(p.v_min), tk(p.tail_k), tv(p.tail_v),
      dq(p.q);
  Device<int32_t> bp(p.block_positions), tp(p.tail_positions), qp(p.q_positions);
  Device<float> out(std::vector<float>(p.q.size(), 123.0f));
  std::vector<int32_t> page_list;
  if (pages != nullptr) {
    page_list.assign(pages->pages,
                     pages->pages + static_cast<int64_t>(p.c.n_kv_heads) * pages->n_selected);
  }
  Device<int32_t> dev_pages(page_list);
  const PageSelection dev_sel =
      pages != nullptr ? PageSelection{dev_pages.get(), pages->n_selected, pages->page_tokens}
                       : PageSelection{};
  kvbench::attention_kivi_cuda(p.query_at(dq.get(), qp.get(), out.get()),
                               p.kv_at(kc.get(), ks.get(), km.get(), vc.get(), vs.get(), vm.get(),
                                       bp.get(), tk.get(), tv.get(), tp.get()),
                               pages != nullptr ? &dev_sel : nullptr, nullptr);
  return out.host();
}

// (blocks, tail) splits of 1, 15, 17 and 4097 slots, with and without blocks and tail.
const std::vector<std::pair<int64_t, int64_t>> kSplits = {{0, 1},  {0, 15},   {0, 17},  {1, 0},
                                                          {1, 15}, {0, 4097}, {128, 1}, {124, 129}};

// 1e-4 absolute: outputs are convex combinations of normal(0, 1) values (|v| < 6); fp32 sums,
// exp2f and fused dequantization against the double reference over the reference dequantization.
constexpr float kKiviTol = 1e-4f;

TEST_CASE("attention_kivi_cuda matches the dequantizing reference over odd sizes", "[gpu]") {
  require_device();
  for (int head_dim : {64, 128}) {
    for (int bits : {2, 4}) {
      for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{8, 1}, std::pair{16, 1}}) {
        for (auto [n_blocks, n_tail] : kSplits) {
          for (int n_queries : {1, 7}) {
            const KiviProblem p(
                KiviCase{n_heads, n_kv_heads, head_dim, bits, n_blocks, n_tail, n_queries},
                static_cast<uint32_t>(n_blocks * 31 + n_tail));
            INFO("head_dim " << head_dim << " bits " << bits << " heads " << n_heads << "/"
                             << n_kv_heads << " blocks " << n_blocks << " tail " << n_tail
                             << " queries " << n_queries);
            CHECK(max_abs_diff(run_kivi_cuda(p, nullptr),
                               p.run(kvbench::attention_kivi_reference, nullptr)) <= kKiviTol);
          }
        }
      }
    }
  }
}

TEST_CASE("attention_kivi_cuda reads only the selected pages", "[gpu]") {
  require_device();
  // Pages of 16 (two per block), 5 (straddling blocks and the tail) and 48 (a block and a half).
  for (int head_dim : {64, 128}) {
    for (int bits : {2, 4}) {
      for (auto [n_blocks, n_tail] : kSplits) {
        for (int32_t page_tokens : {16, 5, 48}) {
          for (bool all : {false, true}) {
            for (int n_queries : {1, 7}) {
              const KiviProblem p(KiviCase{9, 3, head_dim, bits, n_blocks, n_tail, n_queries}, 11);
              const Pages pages(3, p.n_total, page_tokens, static_cast<uint32_t>(n_tail), all);
              INFO("head_dim " << head_dim << " bits " << bits << " blocks " << n_blocks << " tail "
                               << n_tail << " page_tokens " << page_tokens
                               << (all ? " all" : " half") << " queries " << n_queries);
              const auto got = run_kivi_cuda(p, &pages.sel);
              CHECK(max_abs_diff(got, p.run(kvbench::attention_kivi_reference, &pages.sel)) <=
                    kKiviTol);
              if (all)
                CHECK(max_abs_diff(got, p.run(kvbench::attention_kivi_reference, nullptr)) <=
                      kKiviTol);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("attention_kivi_cuda: unsorted positions, long decode, no visible slot", "[gpu]") {
  require_device();
  // kKiviTol as above. A long decode splits over many blocks (split-K).
  for (const KiviCase& c : {KiviCase{9, 3, 64, 2, 40, 33, 7, true},
                            KiviCase{9, 3, 128, 4, 625, 17, 1}, KiviCase{8, 1, 64, 2, 300, 0, 1}}) {
    const KiviProblem p(c, 7);
    INFO("blocks " << c.n_blocks << " tail " << c.n_tail << " queries " << c.n_queries);
    CHECK(max_abs_diff(run_kivi_cuda(p, nullptr),
                       p.run(kvbench::attention_kivi_reference, nullptr)) <= kKiviTol);
  }
  // Exact: a query before every stored position outputs zeros, in the split-K merge too.
  for (const KiviCase& c : {KiviCase{4, 4, 128, 4, 3, 20, 7}, KiviCase{4, 4, 64, 2, 200, 20, 1}}) {
    KiviProblem p(c, 5);
    p.q_positions[0] = 4;  // stored positions start at 5
    const auto got = run_kivi_cuda(p, nullptr);
    for (int e = 0; e < c.n_heads * c.head_dim; ++e) REQUIRE(got[e] == 0.0f);
  }
}

// ---- Quest: gathered attention, page bounds, page scores --------------------------------------

std::vector<float> run_pages_cuda(const AttentionProblem& p, const std::vector<int32_t>& sel,
                                  int n_selected, int page_tokens) {
  const DeviceProblem d(p);
  const Device<int32_t> pages(sel);
  kvbench::attention_pages_cuda(d.query, d.kv,
                                PageSelection{pages.get(), n_selected, page_tokens}, nullptr);
  return d.out.host();
}

std::vector<float> run_pages_reference(AttentionProblem& p, const PageSelection& pages) {
  std::vector<float> out(p.q.size(), 123.0f);
  AttentionQuery query = p.query;
  query.out = out.data();
  kvbench::attention_pages_reference(query, p.kv, pages);
  return out;
}

TEST_CASE("attention_pages_cuda matches the reference over odd sizes and selections", "[gpu]") {
  require_device();
  // 5e-5 absolute, as attention_dense_cuda's test: values in [-1, 1], fp32 against double.
  for (int head_dim : {64, 128}) {
    for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{8, 1}}) {
      for (int64_t n_tokens : {1, 15, 17, 4097}) {
        for (int page_tokens : {16, 5}) {
          for (Pick pick : {Pick::Last, Pick::All, Pick::Alternate, Pick::Random}) {
            for (int n_queries : {1, 7}) {
              AttentionProblem p(Case{n_heads, n_kv_heads, head_dim, n_tokens, n_queries},
                                 static_cast<uint32_t>(n_tokens));
              int n_selected = 0;
              const auto sel = pick_pages(pick, n_kv_heads, pages_of(n_tokens, page_tokens),
                                          static_cast<uint32_t>(n_tokens), n_selected);
              INFO("head_dim " << head_dim << " heads " << n_heads << "/" << n_kv_heads
                               << " tokens " << n_tokens << " page_tokens " << page_tokens
                               << " pick " << static_cast<int>(pick) << " queries " << n_queries);
              const auto expected =
                  run_pages_reference(p, PageSelection{sel.data(), n_selected, page_tokens});
              CHECK(max_abs_diff(run_pages_cuda(p, sel, n_selected, page_tokens), expected) <=
                    5e-5f);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("attention_pages_cuda: a decode query over selected pages of a long context", "[gpu]") {
  require_device();
  // 5e-5 as above; split-K over the selected pages. Unselected pages are NaN: reading one shows.
  for (int n_selected : {1, 7, 64, 200}) {
    const int64_t n_tokens = 20000;
    AttentionProblem p(Case{9, 3, 128, n_tokens, 1}, static_cast<uint32_t>(n_selected));
    const int64_t n_pages = pages_of(n_tokens, 16);
    std::mt19937 rng(static_cast<uint32_t>(n_selected));
    std::vector<int32_t> sel;
    for (int h = 0; h < 3; ++h) {
      std::vector<int32_t> all(n_pages);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      all.resize(n_selected);
      std::sort(all.begin(), all.end());
      sel.insert(sel.end(), all.begin(), all.end());
      std::vector<char> chosen(n_pages, 0);
      for (int32_t pg : all) chosen[pg] = 1;
      for (int64_t t = 0; t < n_tokens; ++t) {
        if (chosen[t / 16]) continue;
        std::fill_n(p.k.begin() + (h * p.kv.capacity + t) * 128, 128, std::nanf(""));
        std::fill_n(p.v.begin() + (h * p.kv.capacity + t) * 128, 128, std::nanf(""));
      }
    }
    INFO("selected " << n_selected);
    CHECK(max_abs_diff(run_pages_cuda(p, sel, n_selected, 16),
                       run_pages_reference(p, PageSelection{sel.data(), n_selected, 16})) <= 5e-5f);
  }
}

TEST_CASE("page_bounds_append_cuda built in pieces equals the CPU's, bit for bit", "[gpu]") {
  require_device();
  // Exact: bounds are minima and maxima. Keys arrive in pieces of 1, 7, 33 and the rest, so
  // pages are started, extended and completed across calls.
  for (int head_dim : {64, 128}) {
    for (int64_t n_tokens : {1, 15, 17, 4097}) {
      for (int32_t page_tokens : {16, 5}) {
        const int n_kv_heads = 3;
        const int64_t cap = pages_of(n_tokens, page_tokens) + 2;
        const auto k = random_floats(static_cast<size_t>(n_tokens * n_kv_heads * head_dim),
                                     static_cast<uint32_t>(n_tokens + head_dim));
        const size_t bound_floats = static_cast<size_t>(n_kv_heads * cap * head_dim);
        std::vector<float> lo(bound_floats, 99.0f), hi(bound_floats, 99.0f);
        PageBounds cpu{lo.data(), hi.data(), n_kv_heads, head_dim, page_tokens, cap, 0};
        Device<float> dk(k), dlo(lo), dhi(hi);
        PageBounds gpu{dlo.get(), dhi.get(), n_kv_heads, head_dim, page_tokens, cap, 0};
        int64_t first = 0;
        for (int64_t piece : {int64_t{1}, int64_t{7}, int64_t{33}, n_tokens}) {
          const int64_t n_new = std::min(piece, n_tokens - first);
          if (n_new <= 0) break;
          const float* keys = k.data() + first * n_kv_heads * head_dim;
          kvbench::page_bounds_append_cpu(cpu, keys, first, n_new);
          kvbench::page_bounds_append_cuda(gpu, dk.get() + first * n_kv_heads * head_dim, first,
                                           n_new, nullptr);
          first += n_new;
        }
        INFO("head_dim " << head_dim << " tokens " << n_tokens << " page_tokens " << page_tokens);
        CHECK(gpu.n_pages == cpu.n_pages);
        CHECK(bitwise_equal(dlo.host(), lo));
        CHECK(bitwise_equal(dhi.host(), hi));
      }
    }
  }
}

TEST_CASE("page_scores_cuda matches the reference", "[gpu]") {
  require_device();
  for (int head_dim : {64, 128}) {
    for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{8, 1}, std::pair{4, 4}}) {
      for (int64_t n_pages : {1, 15, 17, 4097}) {
        const int64_t cap = n_pages + 3;
        const int group = n_heads / n_kv_heads;
        const int n_queries = 3;
        auto lo = random_floats(static_cast<size_t>(n_kv_heads * cap * head_dim),
                                static_cast<uint32_t>(n_pages));
        auto hi = random_floats(lo.size(), static_cast<uint32_t>(n_pages + 1));
        for (size_t j = 0; j < lo.size(); ++j) {
          if (hi[j] < lo[j]) std::swap(hi[j], lo[j]);
        }
        const auto q = random_floats(static_cast<size_t>(n_queries * n_heads * head_dim), 3);
        const PageBounds bounds{lo.data(), hi.data(), n_kv_heads, head_dim, 16, cap, n_pages};
        Device<float> dlo(lo), dhi(hi), dq(q);
        const PageBounds dev_bounds{dlo.get(), dhi.get(), n_kv_heads, head_dim, 16, cap, n_pages};
        for (int32_t row : {0, n_queries - 1}) {
          const AttentionQuery query{q.data(), nullptr, nullptr, n_queries, n_heads, 1.0f};
          const AttentionQuery dev_query{dq.get(), nullptr, nullptr, n_queries, n_heads, 1.0f};
          std::vector<float> expected(static_cast<size_t>(n_kv_heads * n_pages) + 1, 99.0f);
          kvbench::page_scores_reference(query, row, bounds, expected.data());
          Device<float> scores(std::vector<float>(expected.size(), 99.0f));
          kvbench::page_scores_cuda(dev_query, row, dev_bounds, scores.get(), nullptr);
          const auto got = scores.host();
          INFO("head_dim " << head_dim << " heads " << n_heads << "/" << n_kv_heads << " pages "
                           << n_pages << " row " << row);
          REQUIRE(got.back() == 99.0f);  // nothing written past [n_kv_heads, n_pages]
          for (int h = 0; h < n_kv_heads; ++h) {
            for (int64_t pg = 0; pg < n_pages; ++pg) {
              // 1e-5 relative to the sum of |terms|, as page_scores_cpu's test: fp32 sums in a
              // different order against a double sum.
              double magnitude = 0.0;
              for (int g = 0; g < group; ++g) {
                const float* qh = q.data() + (row * n_heads + h * group + g) * head_dim;
                for (int d = 0; d < head_dim; ++d) {
                  const int64_t at = (h * cap + pg) * head_dim + d;
                  magnitude += std::fabs(qh[d]) * std::max(std::fabs(lo[at]), std::fabs(hi[at]));
                }
              }
              REQUIRE(std::fabs(got[h * n_pages + pg] - expected[h * n_pages + pg]) <=
                      1e-5 * magnitude + 1e-6);
            }
          }
        }
      }
    }
  }
}

// ---- Merging ----------------------------------------------------------------------------------

TEST_CASE("adjacent_key_cosine_cuda matches the reference in a shuffled order", "[gpu]") {
  require_device();
  // 1e-5 absolute, as adjacent_key_cosine_cpu's test: a cosine is in [-1, 1]; fp32 dot products
  // of 64-128 terms against double. Zero keys (two adjacent in the order) give exactly 0.
  for (int head_dim : {64, 128}) {
    for (int64_t n_tokens : {1, 2, 15, 17, 4097}) {
      const int n_kv_heads = 3;
      const int64_t cap = n_tokens + 5;
      auto k = random_floats(static_cast<size_t>(n_kv_heads * cap * head_dim),
                             static_cast<uint32_t>(n_tokens));
      std::mt19937 rng(static_cast<uint32_t>(head_dim));
      std::vector<int32_t> order(n_kv_heads * n_tokens);
      for (int h = 0; h < n_kv_heads; ++h) {
        std::iota(order.begin() + h * n_tokens, order.begin() + (h + 1) * n_tokens, 0);
        std::shuffle(order.begin() + h * n_tokens, order.begin() + (h + 1) * n_tokens, rng);
        for (int64_t i : {int64_t{0}, n_tokens / 2, n_tokens / 2 + 1}) {
          if (i >= n_tokens) continue;
          std::fill_n(k.begin() + (h * cap + order[h * n_tokens + i]) * head_dim, head_dim, 0.0f);
        }
      }
      std::vector<int32_t> positions(n_kv_heads * cap, 0);
      const DenseKv kv{k.data(), k.data(), positions.data(), n_kv_heads, head_dim, cap, n_tokens};
      std::vector<float> expected(n_kv_heads * n_tokens + 1, 99.0f);
      kvbench::adjacent_key_cosine_reference(kv, order.data(), expected.data());
      Device<float> dk(k), sim(std::vector<float>(expected.size(), 99.0f));
      Device<int32_t> dpos(positions), dorder(order);
      const DenseKv dev_kv{dk.get(), dk.get(), dpos.get(), n_kv_heads, head_dim, cap, n_tokens};
      kvbench::adjacent_key_cosine_cuda(dev_kv, dorder.get(), sim.get(), nullptr);
      const auto got = sim.host();
      INFO("head_dim " << head_dim << " tokens " << n_tokens);
      REQUIRE(got.back() == 99.0f);
      for (int h = 0; h < n_kv_heads; ++h) {
        for (int64_t i = 0; i < n_tokens; ++i) {
          const float s = got[h * n_tokens + i];
          REQUIRE(std::fabs(s - expected[h * n_tokens + i]) <= 1e-5f);
          if (i + 1 == n_tokens || expected[h * n_tokens + i] == 0.0f) REQUIRE(s == 0.0f);
        }
      }
    }
  }
}

}  // namespace
