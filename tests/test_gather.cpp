// gather_rows_cpu: a retain plan applied out of place, on hand-built keys (the CPU reference of
// gather_rows_cuda, which tests/test_cuda_scores.cpp checks against it).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/gather.h"

namespace {

using kvbench::DenseKv;
using kvbench::GatherTarget;

constexpr float kSentinel = -777.0f;

// Two KV heads of four 2-d tokens, capacity 5 with NaN slack; key (h, t) = (10h + t, -(10h + t)),
// value = key + 0.5, position 100h + 3t.
struct Source {
  std::vector<float> k, v;
  std::vector<int32_t> positions;
  DenseKv kv{};
  Source() {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    k.assign(2 * 5 * 2, nan);
    v.assign(k.size(), nan);
    positions.assign(2 * 5, -1);
    for (int h = 0; h < 2; ++h) {
      for (int t = 0; t < 4; ++t) {
        const float x = static_cast<float>(10 * h + t);
        k[(h * 5 + t) * 2] = x;
        k[(h * 5 + t) * 2 + 1] = -x;
        v[(h * 5 + t) * 2] = x + 0.5f;
        v[(h * 5 + t) * 2 + 1] = -x + 0.5f;
        positions[h * 5 + t] = 100 * h + 3 * t;
      }
    }
    kv = DenseKv{k.data(), v.data(), positions.data(), 2, 2, 5, 4};
  }
};

struct Target {
  std::vector<float> k, v;
  std::vector<int32_t> positions;
  explicit Target(int64_t capacity)
      : k(static_cast<size_t>(2 * capacity * 2), kSentinel),
        v(k.size(), kSentinel),
        positions(static_cast<size_t>(2 * capacity), -7) {}
  GatherTarget target(int64_t capacity) {
    return GatherTarget{k.data(), v.data(), positions.data(), capacity};
  }
};

}  // namespace

TEST_CASE("gather_rows_cpu copies each head's kept slots, compacted", "[unit]") {
  const Source src;
  Target out(3);
  // Head 0 keeps slots 3 and 0 (any order), head 1 slot 1 twice (duplicates allowed).
  const std::vector<int32_t> slots = {3, 0, 1, 1};
  const DenseKv got = kvbench::gather_rows_cpu(src.kv, slots.data(), 2, out.target(3));
  CHECK(got.k == out.k.data());
  CHECK(got.v == out.v.data());
  CHECK(got.positions == out.positions.data());
  CHECK(got.n_kv_heads == 2);
  CHECK(got.head_dim == 2);
  CHECK(got.capacity == 3);
  CHECK(got.n_tokens == 2);
  const std::vector<float> expected_k = {3, -3, 0, 0, kSentinel, kSentinel,  // head 0
                                         11, -11, 11, -11, kSentinel, kSentinel};
  CHECK(out.k == expected_k);
  const std::vector<float> expected_v = {3.5f, -2.5f, 0.5f, 0.5f, kSentinel, kSentinel,
                                         11.5f, -10.5f, 11.5f, -10.5f, kSentinel, kSentinel};
  CHECK(out.v == expected_v);
  CHECK(out.positions == std::vector<int32_t>{9, 0, -7, 103, 103, -7});
}

TEST_CASE("gather_rows_cpu: keeping everything, and keeping nothing", "[unit]") {
  const Source src;
  Target out(4);
  const std::vector<int32_t> all = {0, 1, 2, 3, 0, 1, 2, 3};
  kvbench::gather_rows_cpu(src.kv, all.data(), 4, out.target(4));
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      for (int d = 0; d < 2; ++d) {
        CHECK(out.k[(h * 4 + t) * 2 + d] == src.k[(h * 5 + t) * 2 + d]);
        CHECK(out.v[(h * 4 + t) * 2 + d] == src.v[(h * 5 + t) * 2 + d]);
      }
      CHECK(out.positions[h * 4 + t] == src.positions[h * 5 + t]);
    }
  }
  Target none(1);
  const DenseKv empty = kvbench::gather_rows_cpu(src.kv, nullptr, 0, none.target(1));
  CHECK(empty.n_tokens == 0);
  CHECK(none.positions == std::vector<int32_t>{-7, -7});
}

TEST_CASE("gather_rows_cpu rejects bad plans before writing anything", "[unit]") {
  const Source src;
  Target out(2);
  const Target untouched(2);
  for (const std::vector<int32_t>& slots :
       {std::vector<int32_t>{0, 1, 2, 4}, std::vector<int32_t>{-1, 1, 2, 3}}) {
    CHECK_THROWS_AS(kvbench::gather_rows_cpu(src.kv, slots.data(), 2, out.target(2)),
                    std::invalid_argument);
  }
  const std::vector<int32_t> three = {0, 1, 2, 0, 1, 2};
  CHECK_THROWS_AS(kvbench::gather_rows_cpu(src.kv, three.data(), 3, out.target(2)),
                  std::invalid_argument);  // more kept than the target holds
  CHECK_THROWS_AS(kvbench::gather_rows_cpu(src.kv, three.data(), -1, out.target(2)),
                  std::invalid_argument);
  CHECK(out.k == untouched.k);
  CHECK(out.v == untouched.v);
  CHECK(out.positions == untouched.positions);
}
