// The CUDA twins of the token-score kernels (kernels/cuda/scores.h) and of the retain-plan gather
// and in-place moves (kernels/cuda/gather.h) against their CPU versions on the same inputs, over
// odd sizes (tokens 1, 15, 17, 4097; head_dim 64 and 128; GQA 9/3 heads). Without a CUDA device
// every case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "attention_problem.h"
#include "cuda_device.h"
#include "kernels/cpu/gather.h"
#include "kernels/cpu/scores.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/scores.h"
#include "random_floats.h"

namespace {

using kvbench::AttentionQuery;
using kvbench::DenseKv;
using kvbench::GatherTarget;
using kvbench::PoolKind;
using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;
using kvbench::testing::Device;
using kvbench::testing::random_floats;
using kvbench::testing::require_device;

constexpr int kGuard = 16;  // floats past the outputs that no kernel may touch
constexpr float kGuardValue = -777.0f;

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Equal bits, or both NaN (the GPU's NaN bit pattern is its own).
bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof(float)) == 0;
}

// ---- Attention scores ---------------------------------------------------------------------------

// Scores [n_heads, n_tokens] starting from `init`, then kGuard guard floats.
std::vector<float> initial_scores(const AttentionProblem& p, float init) {
  const size_t size = static_cast<size_t>(p.query.n_heads * p.kv.n_tokens);
  std::vector<float> scores(size + kGuard, kGuardValue);
  std::fill(scores.begin(), scores.begin() + size, init);
  return scores;
}

std::vector<float> scores_cpu(const AttentionProblem& p,
                              void (*fn)(const AttentionQuery&, const DenseKv&, float*),
                              float init) {
  auto scores = initial_scores(p, init);
  fn(p.query, p.kv, scores.data());
  return scores;
}

std::vector<float> scores_cuda(const AttentionProblem& p, float init) {
  Device<float> k(p.k), v(p.v), q(p.q), scores(initial_scores(p, init));
  Device<int32_t> positions(p.positions), q_positions(p.q_positions);
  DenseKv kv = p.kv;
  kv.k = k.get();
  kv.v = v.get();
  kv.positions = positions.get();
  AttentionQuery query = p.query;
  query.q = q.get();
  query.q_positions = q_positions.get();
  query.out = nullptr;
  kvbench::attention_scores_cuda(query, kv, scores.get(), nullptr);
  return scores.host();
}

// Largest |got - expected| / (|expected| + floor) over the scores; NaN counts as infinitely far.
float max_rel_diff(const std::vector<float>& got, const std::vector<float>& expected, float floor) {
  float worst = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) {
    const float d = std::fabs(got[i] - expected[i]) / (std::fabs(expected[i]) + floor);
    worst = std::isnan(d) ? std::numeric_limits<float>::infinity() : std::max(worst, d);
  }
  return worst;
}

// Relative 1e-4 over a floor of 1e-6, against the double reference and attention_scores_cpu:
// each probability carries its logit's fp32 error (128-term dot products, summed in another order
// in each pass) through exp2f, and its row's fp32 denominator; a score sums up to 600 of them.
constexpr float kScoreTol = 1e-4f;
constexpr float kScoreFloor = 1e-6f;

void check_scores(const Case& c, uint32_t seed, int32_t first_query_position = -1,
                  float init = 0.0f) {
  AttentionProblem p(c, seed);
  if (first_query_position >= 0) p.q_positions[0] = first_query_position;
  INFO("head_dim " << c.head_dim << " heads " << c.n_heads << "/" << c.n_kv_heads << " tokens "
                   << c.n_tokens << " queries " << c.n_queries << " shuffled " << c.shuffled
                   << " init " << init);
  const auto reference = scores_cpu(p, kvbench::attention_scores_reference, init);
  const auto cpu = scores_cpu(p, kvbench::attention_scores_cpu, init);
  const auto got = scores_cuda(p, init);
  const float vs_reference = max_rel_diff(got, reference, kScoreFloor);
  const float vs_cpu = max_rel_diff(got, cpu, kScoreFloor);
  INFO("max relative difference: " << vs_reference << " to the reference, " << vs_cpu
                                   << " to the CPU");
  CHECK(vs_reference <= kScoreTol);
  CHECK(vs_cpu <= kScoreTol);
  for (int e = 0; e < kGuard; ++e) REQUIRE(got[got.size() - kGuard + e] == kGuardValue);
}

TEST_CASE("attention_scores_cuda matches the CPU over odd sizes", "[gpu]") {
  require_device();
  // 1 and 33 queries split the slots in the first pass (too few rows for the GPU), 33 crosses
  // the second pass's 32-row chunks.
  for (int head_dim : {64, 128}) {
    for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{8, 1}, std::pair{4, 4}}) {
      for (int64_t n_tokens : {1, 15, 17, 4097}) {
        for (int n_queries : {1, 7, 33}) {
          check_scores(Case{n_heads, n_kv_heads, head_dim, n_tokens, n_queries},
                       static_cast<uint32_t>(n_tokens + n_queries));
        }
      }
    }
  }
}

TEST_CASE("attention_scores_cuda: many queries, shuffled positions, GQA 16/1", "[gpu]") {
  require_device();
  // 300 and 600 queries fill the GPU without splitting; shuffled positions mask anywhere.
  for (const Case& c : {Case{9, 3, 64, 1000, 300}, Case{4, 4, 128, 300, 600, true},
                        Case{9, 3, 128, 4097, 7, true}, Case{16, 1, 64, 2000, 40},
                        Case{9, 3, 64, 17, 600, true}}) {
    check_scores(c, 2);
  }
}

TEST_CASE("attention_scores_cuda: a query that sees no key adds nothing, and scores accumulate",
          "[gpu]") {
  require_device();
  // Stored positions start at 5: a query at 4 sees nothing.
  for (const Case& c : {Case{9, 3, 64, 15, 1}, Case{9, 3, 64, 15, 2}, Case{9, 3, 128, 4097, 40}}) {
    check_scores(c, 3, 4);
    AttentionProblem p(c, 3);
    p.q_positions[0] = 4;
    if (c.n_queries == 1) {
      const auto got = scores_cuda(p, 0.0f);
      for (int64_t e = 0; e < c.n_heads * c.n_tokens; ++e) REQUIRE(got[e] == 0.0f);
      const auto from_two = scores_cuda(p, 2.0f);
      for (int64_t e = 0; e < c.n_heads * c.n_tokens; ++e) REQUIRE(from_two[e] == 2.0f);
    }
  }
  // Adding into non-zero scores (H2O's accumulation), and the same bits on a second run.
  for (const Case& c : {Case{9, 3, 64, 1000, 1}, Case{9, 3, 128, 1000, 64}}) {
    check_scores(c, 5, -1, 1.0f);
    AttentionProblem p(c, 5);
    CHECK(bitwise_equal(scores_cuda(p, 0.5f), scores_cuda(p, 0.5f)));
  }
}

// ---- Key norms and KeyDiff's anchor cosine ------------------------------------------------------

// Random keys of three KV heads with NaN slack; head 1's middle key and head 2's first are zero.
struct KeyProblem {
  std::vector<float> k;
  std::vector<int32_t> positions;
  DenseKv kv{};
  KeyProblem(int head_dim, int64_t n_tokens, uint32_t seed) {
    const int n_kv_heads = 3;
    const int64_t cap = n_tokens + 5;
    k = random_floats(static_cast<size_t>(n_kv_heads * cap * head_dim), seed);
    for (int h = 0; h < n_kv_heads; ++h) {
      std::fill(k.begin() + (h * cap + n_tokens) * head_dim, k.begin() + (h + 1) * cap * head_dim,
                std::numeric_limits<float>::quiet_NaN());
    }
    std::fill_n(k.begin() + (1 * cap + n_tokens / 2) * head_dim, head_dim, 0.0f);
    std::fill_n(k.begin() + (2 * cap) * head_dim, head_dim, 0.0f);
    positions.assign(static_cast<size_t>(n_kv_heads * cap), 0);
    kv = DenseKv{k.data(), k.data(), positions.data(), n_kv_heads, head_dim, cap, n_tokens};
  }
  size_t outputs() const { return static_cast<size_t>(kv.n_kv_heads * kv.n_tokens); }
};

// Runs a [n_kv_heads, n_tokens] kernel on device copies; the output is followed by guards.
std::vector<float> key_kernel_cuda(const KeyProblem& p,
                                   void (*fn)(const DenseKv&, float*, cudaStream_t)) {
  Device<float> k(p.k), out(std::vector<float>(p.outputs() + kGuard, kGuardValue));
  Device<int32_t> positions(p.positions);
  DenseKv kv = p.kv;
  kv.k = k.get();
  kv.v = k.get();
  kv.positions = positions.get();
  fn(kv, out.get(), nullptr);
  return out.host();
}

TEST_CASE("key_norms_cuda and key_anchor_cosine_cuda match the CPU", "[gpu]") {
  require_device();
  // Norms: relative 1e-5 (fp32 sums of up to 128 squares in another order). Cosines: absolute
  // 1e-5 (in [-1, 1]; the anchors are double sums over norms a rounding apart). Zero keys: 0.
  for (int head_dim : {64, 128, 37}) {
    for (int64_t n_tokens : {1, 15, 17, 4097}) {
      const KeyProblem p(head_dim, n_tokens, static_cast<uint32_t>(n_tokens * 7 + head_dim));
      INFO("head_dim " << head_dim << " tokens " << n_tokens);
      std::vector<float> norms(p.outputs()), cosine(p.outputs());
      kvbench::key_norms_cpu(p.kv, norms.data());
      kvbench::key_anchor_cosine_cpu(p.kv, cosine.data());
      const auto got_norms = key_kernel_cuda(p, kvbench::key_norms_cuda);
      const auto got_cosine = key_kernel_cuda(p, kvbench::key_anchor_cosine_cuda);
      for (int e = 0; e < kGuard; ++e) {
        REQUIRE(got_norms[p.outputs() + e] == kGuardValue);
        REQUIRE(got_cosine[p.outputs() + e] == kGuardValue);
      }
      for (size_t e = 0; e < p.outputs(); ++e) {
        REQUIRE(std::fabs(got_norms[e] - norms[e]) <= 1e-5f * norms[e]);
        REQUIRE(std::fabs(got_cosine[e] - cosine[e]) <= 1e-5f);
        if (norms[e] == 0.0f) {
          REQUIRE(got_norms[e] == 0.0f);
          REQUIRE(got_cosine[e] == 0.0f);
        }
      }
    }
  }
  // Opposite keys: the anchor is exactly zero and every cosine 0, not NaN.
  std::vector<float> opposite = random_floats(64, 9);
  for (int d = 0; d < 64; ++d) opposite.push_back(-opposite[d]);
  const std::vector<int32_t> positions = {0, 1};
  Device<float> dk(opposite), cosine(std::vector<float>(2, kGuardValue));
  Device<int32_t> dpos(positions);
  const DenseKv kv{dk.get(), dk.get(), dpos.get(), 1, 64, 2, 2};
  kvbench::key_anchor_cosine_cuda(kv, cosine.get(), nullptr);
  CHECK(cosine.host() == std::vector<float>{0.0f, 0.0f});
}

// ---- Pooling ------------------------------------------------------------------------------------

TEST_CASE("pool1d_cuda is bit-identical to the CPU", "[gpu]") {
  require_device();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {1, 15, 17, 4097}) {
    const int64_t rows = 3;
    auto in = random_floats(static_cast<size_t>(rows * n), static_cast<uint32_t>(n));
    // NaN at a window's start and inside it (std::max_element keeps a leading NaN only), signed
    // zeros (equal: the first stays), in row 1.
    for (int64_t j : {int64_t{0}, n / 2, n - 1}) in[n + j] = nan;
    if (n > 4) {
      in[n + 1] = -0.0f;
      in[n + 2] = 0.0f;
      in[n + 3] = -0.0f;
    }
    Device<float> din(in);
    for (int32_t kernel : {1, 3, 7, 31}) {
      for (PoolKind kind : {PoolKind::Avg, PoolKind::Max}) {
        INFO("n " << n << " kernel " << kernel << (kind == PoolKind::Max ? " max" : " avg"));
        std::vector<float> expected(in.size() + kGuard, kGuardValue);
        kvbench::pool1d_cpu(in.data(), expected.data(), rows, n, kernel, kind);
        Device<float> out(std::vector<float>(in.size() + kGuard, kGuardValue));
        kvbench::pool1d_cuda(din.get(), out.get(), rows, n, kernel, kind, nullptr);
        const auto got = out.host();
        for (size_t e = 0; e < got.size(); ++e) REQUIRE(same_float(got[e], expected[e]));
      }
    }
  }
}

// ---- Top-k --------------------------------------------------------------------------------------

// top_k_indices_cuda and top_k_indices_cpu on the same rows, for every k given (0 <= k <= n); the
// output is followed by guards, and k = 0 writes nothing.
void check_top_k(const std::vector<float>& values, int64_t rows, int64_t n,
                 const std::vector<int64_t>& ks) {
  Device<float> dv(values);
  for (int64_t k : ks) {
    if (k < 0 || k > n) continue;
    INFO("rows " << rows << " n " << n << " k " << k);
    std::vector<int32_t> expected(static_cast<size_t>(rows * k) + kGuard, -7);
    kvbench::top_k_indices_cpu(values.data(), rows, n, k, expected.data());
    Device<int32_t> out(std::vector<int32_t>(expected.size(), -7));
    kvbench::top_k_indices_cuda(dv.get(), rows, n, k, out.get(), nullptr);
    REQUIRE(out.host() == expected);
  }
}

TEST_CASE("top_k_indices_cuda returns the CPU's indices", "[gpu]") {
  require_device();
  // Normal floats: practically no ties.
  for (int64_t n : {1, 15, 17, 4097, 131077}) {
    const int64_t rows = 3;
    const auto values = random_floats(static_cast<size_t>(rows * n), static_cast<uint32_t>(n + 1));
    check_top_k(values, rows, n, {0, 1, 5, n / 3, n / 2 + 1, n - 1, n});
  }
}

TEST_CASE("top_k_indices_cuda: ties to the lower index, NaN last, signed zeros equal", "[gpu]") {
  require_device();
  std::mt19937 rng(11);
  // Many ties: 50 distinct values.
  for (int64_t n : {15, 17, 4097}) {
    const int64_t rows = 5;
    std::vector<float> values(static_cast<size_t>(rows * n));
    for (auto& x : values) x = static_cast<float>(rng() % 50);
    check_top_k(values, rows, n, {1, 2, 37, n / 2, n - 1, n});
  }
  // One value everywhere: the first k indices.
  check_top_k(std::vector<float>(3 * 4097, 0.25f), 3, 4097, {1, 100, 4096});
  // NaN, infinities and signed zeros mixed in.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> pool = {nan, inf, -inf, 0.0f, -0.0f, 1.0f, -1.0f, -nan};
  for (int64_t n : {17, 4097}) {
    const int64_t rows = 4;
    std::vector<float> values(static_cast<size_t>(rows * n));
    for (auto& x : values) x = pool[rng() % pool.size()];
    check_top_k(values, rows, n, {1, 3, n / 4, n / 2, n - 3, n});
  }
}

// ---- Gather -------------------------------------------------------------------------------------

// A source DenseKv (NaN slack) and a retain plan of n_keep slots per head, gathered by both
// kernels into targets of capacity n_keep + 3 prefilled with sentinels; `offset` floats before
// every buffer make the rows unaligned for float4 when odd.
void check_gather(int head_dim, int n_kv_heads, int64_t n_tokens, int64_t n_keep,
                  const std::vector<int32_t>& slots, int offset) {
  REQUIRE(static_cast<int64_t>(slots.size()) == n_kv_heads * n_keep);
  const int64_t cap = n_tokens + 5, out_cap = n_keep + 3;
  const size_t kv_floats = static_cast<size_t>(n_kv_heads * cap * head_dim);
  std::vector<float> k = random_floats(kv_floats + offset, static_cast<uint32_t>(n_tokens));
  std::vector<float> v = random_floats(kv_floats + offset, static_cast<uint32_t>(n_tokens + 1));
  std::vector<int32_t> positions(static_cast<size_t>(n_kv_heads * cap), -1);
  for (int h = 0; h < n_kv_heads; ++h) {
    for (int64_t t = 0; t < n_tokens; ++t) positions[h * cap + t] = static_cast<int32_t>(3 * t + h);
  }
  const size_t out_floats = static_cast<size_t>(n_kv_heads * out_cap * head_dim) + offset;
  std::vector<float> out_k(out_floats, kGuardValue), out_v(out_floats, kGuardValue);
  std::vector<int32_t> out_pos(static_cast<size_t>(n_kv_heads * out_cap), -7);

  const DenseKv kv{k.data() + offset, v.data() + offset, positions.data(), n_kv_heads,
                   head_dim,          cap,               n_tokens};
  kvbench::gather_rows_cpu(
      kv, slots.data(), n_keep,
      GatherTarget{out_k.data() + offset, out_v.data() + offset, out_pos.data(), out_cap});

  Device<float> dk(k), dv(v), dout_k(std::vector<float>(out_floats, kGuardValue)),
      dout_v(std::vector<float>(out_floats, kGuardValue));
  Device<int32_t> dpos(positions), dslots(slots),
      dout_pos(std::vector<int32_t>(out_pos.size(), -7));
  const DenseKv dev_kv{dk.get() + offset, dv.get() + offset, dpos.get(), n_kv_heads,
                       head_dim,          cap,               n_tokens};
  const DenseKv view = kvbench::gather_rows_cuda(
      dev_kv, dslots.get(), n_keep,
      GatherTarget{dout_k.get() + offset, dout_v.get() + offset, dout_pos.get(), out_cap}, nullptr);
  CHECK(view.k == dout_k.get() + offset);
  CHECK(view.n_tokens == n_keep);
  CHECK(view.capacity == out_cap);
  CHECK(bitwise_equal(dout_k.host(), out_k));
  CHECK(bitwise_equal(dout_v.host(), out_v));
  CHECK(dout_pos.host() == out_pos);
}

TEST_CASE("gather_rows_cuda is bit-identical to gather_rows_cpu", "[gpu]") {
  require_device();
  const int n_kv_heads = 3;
  for (int head_dim : {64, 128, 3}) {
    for (int64_t n_tokens : {1, 15, 17, 4097}) {
      for (int64_t n_keep : {int64_t{1}, n_tokens / 2 + 1, n_tokens}) {
        for (int offset : {0, 1}) {
          INFO("head_dim " << head_dim << " tokens " << n_tokens << " keep " << n_keep
                           << " offset " << offset);
          // Each head its own ascending subset (per-head eviction).
          std::mt19937 rng(static_cast<uint32_t>(n_tokens * 3 + n_keep));
          std::vector<int32_t> slots;
          for (int h = 0; h < n_kv_heads; ++h) {
            std::vector<int32_t> all(static_cast<size_t>(n_tokens));
            std::iota(all.begin(), all.end(), 0);
            std::shuffle(all.begin(), all.end(), rng);
            std::sort(all.begin(), all.begin() + n_keep);
            slots.insert(slots.end(), all.begin(), all.begin() + n_keep);
          }
          check_gather(head_dim, n_kv_heads, n_tokens, n_keep, slots, offset);
        }
      }
    }
  }
  // Descending and repeated slots are copied as planned.
  check_gather(64, 3, 17, 4, {16, 3, 3, 0, 0, 0, 0, 0, 5, 16, 1, 2}, 0);
  // Keeping nothing writes nothing.
  check_gather(64, 3, 17, 0, {}, 0);
}

TEST_CASE("gather_rows_cuda leaves a row whose slot is out of range unwritten", "[gpu]") {
  require_device();
  const int head_dim = 64;
  const int64_t n_tokens = 4, cap = 4;
  const auto k = random_floats(static_cast<size_t>(cap * head_dim), 1);
  const std::vector<int32_t> positions = {10, 11, 12, 13}, slots = {2, 4, -1};
  Device<float> dk(k), out_k(std::vector<float>(3 * head_dim, kGuardValue)),
      out_v(std::vector<float>(3 * head_dim, kGuardValue));
  Device<int32_t> dpos(positions), dslots(slots), out_pos(std::vector<int32_t>(3, -7));
  const DenseKv kv{dk.get(), dk.get(), dpos.get(), 1, head_dim, cap, n_tokens};
  kvbench::gather_rows_cuda(kv, dslots.get(), 3,
                            GatherTarget{out_k.get(), out_v.get(), out_pos.get(), 3}, nullptr);
  const auto got_k = out_k.host();
  CHECK(out_pos.host() == std::vector<int32_t>{12, -7, -7});
  CHECK(std::equal(got_k.begin(), got_k.begin() + head_dim, k.begin() + 2 * head_dim));
  CHECK(std::all_of(got_k.begin() + head_dim, got_k.end(), [](float x) { return x == kGuardValue; }));
}

// Rows [n_kv_heads, cap, head_dim] (and positions) with `offset` floats before them, moved by
// both kernels; every byte, slack included, must come out equal.
void check_moves(int head_dim, int n_kv_heads, int64_t cap, const std::vector<int64_t>& from,
                 const std::vector<int64_t>& to, int offset) {
  const size_t floats = static_cast<size_t>(n_kv_heads * cap * head_dim) + offset;
  std::vector<float> k = random_floats(floats, static_cast<uint32_t>(cap));
  std::vector<float> v = random_floats(floats, static_cast<uint32_t>(cap + 1));
  std::vector<int32_t> positions(static_cast<size_t>(n_kv_heads * cap));
  std::iota(positions.begin(), positions.end(), 1000);
  Device<float> dk(k), dv(v);
  Device<int32_t> dpos(positions);
  const int64_t n_moves = static_cast<int64_t>(from.size());
  const Device<int64_t> dfrom(from), dto(to);
  kvbench::move_rows_cpu(GatherTarget{k.data() + offset, v.data() + offset, positions.data(), cap},
                         n_kv_heads, head_dim, from.data(), to.data(), n_moves);
  kvbench::move_rows_cuda(GatherTarget{dk.get() + offset, dv.get() + offset, dpos.get(), cap},
                          n_kv_heads, head_dim, dfrom.get(), dto.get(), n_moves, nullptr);
  CHECK(bitwise_equal(dk.host(), k));
  CHECK(bitwise_equal(dv.host(), v));
  CHECK(dpos.host() == positions);
}

TEST_CASE("move_rows_cuda is bit-identical to move_rows_cpu", "[gpu]") {
  require_device();
  const int n_kv_heads = 3;
  for (int head_dim : {64, 128, 3}) {
    for (int64_t cap : {2, 17, 4097}) {
      for (int offset : {0, 1}) {
        INFO("head_dim " << head_dim << " capacity " << cap << " offset " << offset);
        // Each head's holes below n_keep filled from its rows at or past it, as
        // place_kept_slots does: one move, several, or a whole half.
        std::mt19937 rng(static_cast<uint32_t>(cap * 7 + head_dim));
        for (int64_t per_head : {int64_t{1}, std::min<int64_t>(5, cap / 2), cap / 2}) {
          std::vector<int64_t> from, to;
          const int64_t n_keep = cap - per_head;
          for (int64_t h = 0; h < n_kv_heads; ++h) {
            std::vector<int64_t> below(static_cast<size_t>(n_keep)),
                past(static_cast<size_t>(per_head));
            std::iota(below.begin(), below.end(), 0);
            std::iota(past.begin(), past.end(), n_keep);
            std::shuffle(below.begin(), below.end(), rng);
            for (int64_t i = 0; i < per_head && i < n_keep; ++i) {
              from.push_back(h * cap + past[i]);
              to.push_back(h * cap + below[i]);
            }
          }
          check_moves(head_dim, n_kv_heads, cap, from, to, offset);
        }
      }
    }
  }
  check_moves(64, 3, 17, {}, {}, 0);  // no moves: nothing changes
}

TEST_CASE("move_rows_cuda skips a move whose row is out of range", "[gpu]") {
  require_device();
  const int head_dim = 64;
  const int64_t cap = 4;
  const auto k = random_floats(static_cast<size_t>(cap * head_dim), 2);
  const std::vector<int32_t> positions = {10, 11, 12, 13};
  Device<float> dk(k), dv(k);
  Device<int32_t> dpos(positions);
  const Device<int64_t> from(std::vector<int64_t>{3, 4, -1}), to(std::vector<int64_t>{0, 1, 2});
  kvbench::move_rows_cuda(GatherTarget{dk.get(), dv.get(), dpos.get(), cap}, 1, head_dim,
                          from.get(), to.get(), 3, nullptr);
  const auto got = dk.host();
  CHECK(dpos.host() == std::vector<int32_t>{13, 11, 12, 13});
  CHECK(std::equal(got.begin(), got.begin() + head_dim, k.begin() + 3 * head_dim));
  CHECK(std::equal(got.begin() + head_dim, got.end(), k.begin() + head_dim));
}

}  // namespace
