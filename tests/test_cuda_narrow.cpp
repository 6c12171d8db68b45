// The narrow kernels on the device (kernels/cuda/narrow.h, attention_narrow_cuda) against the
// CPU's (kernels/cpu/narrow.h, attention_narrow_cpu): rounding bit for bit, widening bit for
// bit, attention over dense and paged selections within fp32's summation order. The first
// case checks the device's conversion code itself (kernels/cuda/narrow_element.h, compiled
// here for the host) against the CPU's over every input class, which holds whether or not a
// GPU runs it. Without a CUDA device the other cases print "no CUDA device: skipped" and exit
// 77 (ctest SKIP).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attention_problem.h"
#include "cuda_device.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/layer_ops.h"
#include "kernels/cpu/narrow.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/narrow.h"
#include "kernels/cuda/narrow_element.h"
#include "page_picks.h"
#include "random_floats.h"

namespace {

using namespace kvbench;
using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;
using kvbench::testing::Device;
using kvbench::testing::max_abs_diff;
using kvbench::testing::pages_of;
using kvbench::testing::Pick;
using kvbench::testing::pick_pages;
using kvbench::testing::random_floats;
using kvbench::testing::require_device;

constexpr KvElement kElements[] = {KvElement::F16, KvElement::BF16, KvElement::F8E4M3};

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

uint32_t to_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// Equal bits, or both NaN (the CPU's fp16 widening may quiet a signalling NaN).
bool same_value(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || to_bits(a) == to_bits(b);
}

// Rows that exercise every rounding path: normal values of several scales, fp16 and e4m3
// subnormals, ties, values past each format's range, zeros, infinities and a NaN.
std::vector<float> awkward_rows(int64_t n_rows, int32_t dim, uint32_t seed) {
  std::vector<float> x = random_floats(static_cast<size_t>(n_rows * dim), seed);
  std::mt19937 rng(seed);
  const float scales[] = {1.0f, 1e-3f, 1e-6f, 300.0f, 7e4f, 1e-30f};
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = x.data() + r * dim;
    const float s = scales[r % 6];
    for (int32_t d = 0; d < dim; ++d) row[d] *= s;
    if (r % 7 == 3) std::fill(row, row + dim, 0.0f);  // fp8's scale 1
    if (r % 5 == 1) {
      row[rng() % dim] = from_bits(0x3f801000u);                 // an fp16 tie
      row[rng() % dim] = from_bits(0x3f808000u);                 // a bf16 tie
      row[rng() % dim] = -std::numeric_limits<float>::infinity();
      row[rng() % dim] = 65520.0f;                               // rounds to fp16 infinity
    }
    if (r % 11 == 2) row[rng() % dim] = std::numeric_limits<float>::quiet_NaN();
  }
  return x;
}

}  // namespace

TEST_CASE("the device's conversion code equals the CPU's over every input class", "[gpu]") {
  // Every sign, exponent and upper mantissa (the high 16 bits) with low bits at and around
  // each format's rounding tie, then random patterns: rounding, saturation, subnormals, NaN.
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x2000u, 0x3000u,
                           0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu};
  std::vector<uint32_t> inputs;
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    for (uint32_t low : lows) inputs.push_back(high << 16 | low);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) inputs.push_back(static_cast<uint32_t>(rng()));
  for (uint32_t u : inputs) {
    const float x = from_bits(u);
    INFO("input bits " << std::hex << u);
    REQUIRE(narrow::half_bits(x) == float_to_half_bits(x));
    REQUIRE(narrow::bf16_bits(x) == float_to_bf16_bits(x));
    REQUIRE(narrow::e4m3_bits(x) == float_to_e4m3(x));
  }
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    INFO("code " << b);
    REQUIRE(same_value(narrow::half_value(static_cast<uint16_t>(b)),
                       half_to_float(static_cast<uint16_t>(b))));
    REQUIRE(same_value(narrow::bf16_value(static_cast<uint16_t>(b)),
                       bf16_bits_to_float(static_cast<uint16_t>(b))));
  }
  for (uint32_t c = 0; c < 0x100u; ++c) {
    INFO("code " << c);
    REQUIRE(same_value(narrow::e4m3_value(static_cast<uint8_t>(c)),
                       e4m3_to_float(static_cast<uint8_t>(c))));
  }
  const float row[] = {0.5f, -3.0f, 2.0f};
  CHECK(narrow::e4m3_scale(3.0f) == e4m3_row_scale(row, 3));
  CHECK(narrow::e4m3_scale(0.0f) == 1.0f);
}

TEST_CASE("encode_kv_rows_cuda and decode_kv_rows_cuda equal the CPU's bit for bit", "[gpu]") {
  require_device();
  for (KvElement element : kElements) {
    for (int32_t dim : {64, 128, 37}) {
      const int64_t n_rows = 67, stride = dim + 5;  // rows read from a wider buffer
      const std::vector<float> src = awkward_rows(n_rows, stride, static_cast<uint32_t>(dim));
      const int64_t bytes = n_rows * dim * kv_element_bytes(element);
      std::vector<uint8_t> cpu(static_cast<size_t>(bytes));
      std::vector<float> cpu_scale(n_rows, 0.0f);
      encode_kv_rows(element, src.data(), stride, n_rows, dim, cpu.data(), cpu_scale.data());

      const Device<float> d_src(src);
      const Device<uint8_t> d_dst(std::vector<uint8_t>(cpu.size(), 0));
      const Device<float> d_scale(std::vector<float>(n_rows, 0.0f));
      encode_kv_rows_cuda(element, d_src.get(), stride, n_rows, dim, d_dst.get(),
                          element == KvElement::F8E4M3 ? d_scale.get() : nullptr, nullptr);
      INFO("element " << static_cast<int>(element) << " dim " << dim);
      const std::vector<uint8_t> gpu = d_dst.host();
      const size_t first = static_cast<size_t>(
          std::mismatch(gpu.begin(), gpu.end(), cpu.begin()).first - gpu.begin());
      if (first < gpu.size()) {  // where and what, not two byte dumps
        const size_t element_bytes = static_cast<size_t>(kv_element_bytes(element));
        const size_t at = first / element_bytes, row = at / dim, col = at % dim;
        INFO("first difference: row " << row << " column " << col << ", input bits 0x" << std::hex
             << to_bits(src[row * stride + col]) << ", byte " << std::dec << first << ": gpu "
             << int{gpu[first]} << " cpu " << int{cpu[first]} << "; row scale cpu "
             << cpu_scale[row] << " gpu " << d_scale.host()[row]);
        CHECK(first == gpu.size());
      }
      REQUIRE(gpu == cpu);
      if (element == KvElement::F8E4M3) {
        const std::vector<float> scale = d_scale.host();
        for (int64_t r = 0; r < n_rows; ++r) REQUIRE(to_bits(scale[r]) == to_bits(cpu_scale[r]));
      }

      std::vector<float> cpu_wide(static_cast<size_t>(n_rows * dim));
      decode_kv_rows(element, cpu.data(), cpu_scale.data(), n_rows, dim, cpu_wide.data());
      const Device<float> d_wide(std::vector<float>(cpu_wide.size(), 0.0f));
      decode_kv_rows_cuda(element, d_dst.get(),
                          element == KvElement::F8E4M3 ? d_scale.get() : nullptr, n_rows, dim,
                          d_wide.get(), nullptr);
      const std::vector<float> wide = d_wide.host();
      for (size_t i = 0; i < wide.size(); ++i) REQUIRE(same_value(wide[i], cpu_wide[i]));
    }
  }
}

namespace {

// An attention problem's keys and values rounded into a narrow store on the host (its NaN
// slack too, so that a read past n_tokens still shows), and the same on the device.
struct NarrowProblem {
  AttentionProblem p;
  KvElement element;
  std::vector<uint8_t> k, v;
  std::vector<float> k_scale, v_scale;

  NarrowProblem(const Case& c, KvElement e, uint32_t seed) : p(c, seed), element(e) {
    const int64_t rows = p.kv.n_kv_heads * p.kv.capacity;
    const int32_t dim = p.kv.head_dim;
    k.resize(static_cast<size_t>(rows * dim * kv_element_bytes(e)));
    v.resize(k.size());
    k_scale.assign(rows, 0.0f);
    v_scale.assign(rows, 0.0f);
    encode_kv_rows(e, p.k.data(), dim, rows, dim, k.data(), k_scale.data());
    encode_kv_rows(e, p.v.data(), dim, rows, dim, v.data(), v_scale.data());
  }

  NarrowKv layout(const void* k_at, const void* v_at, const float* ks, const float* vs,
                  const int32_t* positions) const {
    const bool scaled = element == KvElement::F8E4M3;
    return NarrowKv{k_at,         v_at,           scaled ? ks : nullptr, scaled ? vs : nullptr,
                    positions,    element,        p.kv.n_kv_heads,       p.kv.head_dim,
                    p.kv.capacity, p.kv.n_tokens};
  }

  std::vector<float> run_cpu(const PageSelection* pages) {
    std::vector<float> out(p.q.size(), 123.0f);
    AttentionQuery query = p.query;
    query.out = out.data();
    attention_narrow_cpu(query,
                         layout(k.data(), v.data(), k_scale.data(), v_scale.data(),
                                p.positions.data()),
                         pages);
    return out;
  }

  // pages: host ids [n_kv_heads, n_selected] (nullptr: every slot).
  std::vector<float> run_cuda(const std::vector<int32_t>* pages, int32_t n_selected,
                              int32_t page_tokens) {
    const Device<uint8_t> dk(k), dv(v);
    const Device<float> dks(k_scale), dvs(v_scale), dq(p.q),
        dout(std::vector<float>(p.q.size(), 123.0f));
    const Device<int32_t> dpos(p.positions), dqpos(p.q_positions),
        dpages(pages ? *pages : std::vector<int32_t>{});
    AttentionQuery query = p.query;
    query.q = dq.get();
    query.q_positions = dqpos.get();
    query.out = dout.get();
    const PageSelection selection{dpages.get(), n_selected, page_tokens};
    attention_narrow_cuda(query, layout(dk.get(), dv.get(), dks.get(), dvs.get(), dpos.get()),
                          pages ? &selection : nullptr, nullptr);
    return dout.host();
  }
};

}  // namespace

TEST_CASE("attention_narrow_cuda matches attention_narrow_cpu over every slot", "[gpu]") {
  require_device();
  // 5e-5 absolute, as attention_dense_cuda's test: the same kernel, fp32 sums in another order.
  for (KvElement element : kElements) {
    for (int head_dim : {64, 128}) {
      for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{8, 1}}) {
        for (int64_t n_tokens : {1, 17, 4097}) {
          for (int n_queries : {1, 7}) {
            NarrowProblem np(Case{n_heads, n_kv_heads, head_dim, n_tokens, n_queries, true},
                             element, static_cast<uint32_t>(n_tokens));
            INFO("element " << static_cast<int>(element) << " head_dim " << head_dim << " heads "
                            << n_heads << "/" << n_kv_heads << " tokens " << n_tokens
                            << " queries " << n_queries);
            CHECK(max_abs_diff(np.run_cuda(nullptr, 0, 0), np.run_cpu(nullptr)) <= 5e-5f);
          }
        }
      }
    }
  }
}

TEST_CASE("attention_narrow_cuda matches attention_narrow_cpu over selected pages", "[gpu]") {
  require_device();
  for (KvElement element : kElements) {
    for (int head_dim : {64, 128}) {
      for (int64_t n_tokens : {15, 4097}) {
        for (int page_tokens : {16, 5}) {
          for (Pick pick : {Pick::Last, Pick::Alternate, Pick::Random}) {
            for (int n_queries : {1, 7}) {
              NarrowProblem np(Case{9, 3, head_dim, n_tokens, n_queries}, element,
                               static_cast<uint32_t>(n_tokens + page_tokens));
              int n_selected = 0;
              const auto sel = pick_pages(pick, 3, pages_of(n_tokens, page_tokens),
                                          static_cast<uint32_t>(n_tokens), n_selected);
              const PageSelection host{sel.data(), n_selected, page_tokens};
              INFO("element " << static_cast<int>(element) << " head_dim " << head_dim
                              << " tokens " << n_tokens << " page_tokens " << page_tokens
                              << " pick " << static_cast<int>(pick) << " queries " << n_queries);
              CHECK(max_abs_diff(np.run_cuda(&sel, n_selected, page_tokens), np.run_cpu(&host)) <=
                    5e-5f);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("attention_narrow_cuda: fp8 without its scales is refused", "[gpu]") {
  require_device();
  NarrowProblem np(Case{4, 4, 64, 15, 1}, KvElement::F8E4M3, 3);
  const Device<uint8_t> dk(np.k);
  const Device<float> dq(np.p.q), dout(std::vector<float>(np.p.q.size(), 0.0f));
  const Device<int32_t> dpos(np.p.positions), dqpos(np.p.q_positions);
  AttentionQuery query = np.p.query;
  query.q = dq.get();
  query.q_positions = dqpos.get();
  query.out = dout.get();
  NarrowKv kv = np.layout(dk.get(), dk.get(), nullptr, nullptr, dpos.get());
  CHECK_THROWS_AS(attention_narrow_cuda(query, kv, nullptr, nullptr), std::invalid_argument);
}
