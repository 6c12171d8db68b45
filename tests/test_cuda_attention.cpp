// attention_dense_cuda against the CPU double-precision reference over odd sizes. Without a
// CUDA device every case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "attention_problem.h"
#include "cuda_device.h"
#include "device_problem.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"

namespace {

using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;
using kvbench::testing::Device;
using kvbench::testing::DeviceProblem;
using kvbench::testing::max_abs_diff;
using kvbench::testing::require_device;

using kvbench::attention_dense_reference;
using kvbench::AttentionQuery;
using kvbench::DenseKv;

// Runs the CUDA kernel on a device copy of the problem and brings the output back.
std::vector<float> run_cuda(const AttentionProblem& p) {
  const DeviceProblem d(p);
  kvbench::attention_dense_cuda(d.query, d.kv, nullptr);
  return d.out.host();
}

}  // namespace

TEST_CASE("attention_dense_cuda matches the reference over odd sizes", "[gpu]") {
  require_device();
  // 5e-5 absolute: outputs are convex combinations of values in [-1, 1]; fp32 warp-shuffle
  // dot products and exp2f (2 ulp) against a double two-pass reference.
  for (int head_dim : {64, 128}) {
    for (auto [n_heads, n_kv_heads] : {std::pair{9, 3}, std::pair{4, 4}, std::pair{8, 1}}) {
      for (int64_t n_tokens : {1, 15, 17, 4097}) {
        for (int n_queries : {1, 7, 64}) {
          AttentionProblem p(Case{n_heads, n_kv_heads, head_dim, n_tokens, n_queries});
          INFO("head_dim " << head_dim << " heads " << n_heads << "/" << n_kv_heads << " tokens "
                           << n_tokens << " queries " << n_queries);
          CHECK(max_abs_diff(run_cuda(p), p.run(attention_dense_reference)) <= 5e-5f);
        }
      }
    }
  }
}

TEST_CASE("attention_dense_cuda: unsorted positions, long decode, wide groups", "[gpu]") {
  require_device();
  // 5e-5 absolute, as above. 16/1 heads spans two blocks of kMaxGroup = 8 query heads.
  for (const Case& c : {Case{9, 3, 64, 4097, 7, true}, Case{9, 3, 64, 20000, 1},
                        Case{16, 1, 128, 1000, 3}, Case{4, 4, 128, 0, 2}}) {
    AttentionProblem p(c, 11);
    INFO("heads " << c.n_heads << "/" << c.n_kv_heads << " tokens " << c.n_tokens);
    CHECK(max_abs_diff(run_cuda(p), p.run(attention_dense_reference)) <= 5e-5f);
  }
}

TEST_CASE("attention_dense_cuda: a query that sees no key outputs zeros", "[gpu]") {
  require_device();
  // Exact: nothing visible gives 0 by convention, in the split-K merge too.
  for (int64_t n_tokens : {15, 4097}) {
    AttentionProblem p(Case{4, 4, 128, n_tokens, 7}, 5);
    p.q_positions[0] = 4;  // stored positions start at 5
    const auto got = run_cuda(p);
    for (int e = 0; e < 4 * 128; ++e) REQUIRE(got[e] == 0.0f);
  }
}
