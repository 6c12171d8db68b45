// attention_sparse_cuda (sparse prefill on the device) against attention_dense_cuda for a
// pattern that reads every key (bit for bit) and against attention_sparse_cpu for A-shape,
// Tri-shape and MInference-like patterns (within fp32's summation order, the same pairs).
// Without a CUDA device every case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "attention_problem.h"
#include "cuda_device.h"
#include "device_problem.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"

using namespace kvbench;
using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;
using kvbench::testing::Device;
using kvbench::testing::DeviceProblem;
using kvbench::testing::max_abs_diff;
using kvbench::testing::require_device;

namespace {

constexpr int32_t kNone = std::numeric_limits<int32_t>::max();

// A pattern and its lists ([n_heads, n] each) on the host.
struct HostPattern {
  SparsePattern pattern{0, 0, kNone, nullptr, 0, nullptr, 0};
  std::vector<int32_t> columns, offsets;
  SparsePattern view() const {
    SparsePattern p = pattern;
    p.columns = columns.empty() ? nullptr : columns.data();
    p.offsets = offsets.empty() ? nullptr : offsets.data();
    return p;
  }
};

struct Run {
  std::vector<float> out;
  AttentionPairs pairs;
};

// The device problem, with the pattern's lists uploaded when given.
Run run_cuda(const AttentionProblem& p, const HostPattern* pattern) {
  const DeviceProblem d(p);
  const std::vector<int32_t> no_list;
  const Device<int32_t> columns(pattern ? pattern->columns : no_list);
  const Device<int32_t> offsets(pattern ? pattern->offsets : no_list);
  Run run;
  if (pattern) {
    SparsePattern on_device = pattern->pattern;
    on_device.columns = pattern->columns.empty() ? nullptr : columns.get();
    on_device.offsets = pattern->offsets.empty() ? nullptr : offsets.get();
    run.pairs = attention_sparse_cuda(d.query, d.kv, on_device, nullptr);
  } else {
    attention_dense_cuda(d.query, d.kv, nullptr);
  }
  run.out = d.out.host();
  return run;
}

Run run_cpu(AttentionProblem& p, const HostPattern& pattern) {
  Run run;
  run.out.assign(p.q.size(), 123.0f);
  AttentionQuery query = p.query;
  query.out = run.out.data();
  run.pairs = attention_sparse_cpu(query, p.kv, pattern.view());
  return run;
}

int32_t last_position(const AttentionProblem& p) {
  int32_t last = 0;
  for (int32_t qp : p.q_positions) last = std::max(last, qp);
  return last;
}

// MInference's shape: per query head, random key columns and diagonals (the first ones and
// the nearest forced, as the method does), with a duplicate and an entry past every query.
HostPattern vertical_slash(const AttentionProblem& p, int32_t n_columns, int32_t n_offsets,
                           uint32_t seed) {
  std::mt19937 rng(seed);
  const int32_t span = last_position(p) + 1;
  HostPattern hp;
  hp.pattern.n_columns = n_columns;
  hp.pattern.n_offsets = n_offsets;
  for (int h = 0; h < p.query.n_heads; ++h) {
    for (int32_t j = 0; j < n_columns; ++j) {
      hp.columns.push_back(j < 4 ? j : static_cast<int32_t>(rng() % span));
    }
    for (int32_t j = 0; j < n_offsets; ++j) {
      hp.offsets.push_back(j < 4 ? j : static_cast<int32_t>(rng() % span));
    }
    hp.columns.back() = span + 7;           // no visible key there
    hp.offsets[hp.offsets.size() - 2] = 0;  // listed twice
  }
  return hp;
}

}  // namespace

TEST_CASE("attention_sparse_cuda with a pattern reading every key is attention_dense_cuda",
          "[gpu]") {
  require_device();
  // Exact: the same kernel folds the same keys in the same order. Every key is read through
  // the column lists (no sink, window or dense rows), so each tile is tested and walked.
  for (const Case& c : {Case{14, 2, 64, 700, 96}, Case{9, 3, 64, 4097, 1, true},
                        Case{8, 1, 128, 1000, 7}, Case{4, 4, 64, 15, 3}}) {
    AttentionProblem p(c, 3);
    HostPattern all;
    const int32_t span = last_position(p) + 1;
    all.pattern.n_columns = span;
    for (int h = 0; h < c.n_heads; ++h) {
      for (int32_t x = 0; x < span; ++x) all.columns.push_back(x);
    }
    INFO("heads " << c.n_heads << "/" << c.n_kv_heads << " tokens " << c.n_tokens << " queries "
                  << c.n_queries);
    const Run dense = run_cuda(p, nullptr);
    const Run sparse = run_cuda(p, &all);
    CHECK(sparse.out == dense.out);
    CHECK(sparse.pairs.computed == sparse.pairs.dense);
    CHECK(sparse.pairs.dense == run_cpu(p, all).pairs.dense);
  }
}

TEST_CASE("attention_sparse_cuda gives attention_sparse_cpu's output and pairs", "[gpu]") {
  require_device();
  // head_dim 64, GQA 14/2 (two blocks of query heads per KV head on the device), a prefill
  // chunk of 160 queries over 1200 keys, and a few rows over many keys (split-K). Tri-shape's
  // dense rows: the last query's.
  for (const Case& c : {Case{14, 2, 64, 1200, 160}, Case{14, 2, 64, 3000, 4},
                        Case{9, 3, 128, 900, 33, true}}) {
    AttentionProblem p(c, 7);
    HostPattern a_shape, tri_shape;
    a_shape.pattern.sink = 16;
    a_shape.pattern.local = 112;
    tri_shape = a_shape;
    tri_shape.pattern.dense_from = p.q_positions.back();
    HostPattern minference = vertical_slash(p, 40, 60, 11);
    int n = 0;
    for (const HostPattern* pattern : {&a_shape, &tri_shape, &minference}) {
      INFO("heads " << c.n_heads << "/" << c.n_kv_heads << " tokens " << c.n_tokens
                    << " queries " << c.n_queries << " pattern " << n++);
      const Run gpu = run_cuda(p, pattern);
      const Run cpu = run_cpu(p, *pattern);
      // 5e-5 absolute, as attention_dense_cuda against its reference.
      CHECK(max_abs_diff(gpu.out, cpu.out) <= 5e-5f);
      CHECK(gpu.pairs.computed == cpu.pairs.computed);
      CHECK(gpu.pairs.dense == cpu.pairs.dense);
      // The pattern really drops keys, and changes the output.
      CHECK(gpu.pairs.computed < gpu.pairs.dense);
      CHECK(max_abs_diff(gpu.out, run_cuda(p, nullptr).out) > 1e-3f);
    }
  }
}
