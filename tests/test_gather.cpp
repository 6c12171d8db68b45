// gather_rows_cpu: a retain plan applied out of place, on hand-built keys (the CPU reference of
// gather_rows_cuda, which tests/test_cuda_scores.cpp checks against it).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
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

TEST_CASE("move_rows_cpu copies each moved row in place and nothing else", "[unit]") {
  Source src;
  const std::vector<float> k0 = src.k, v0 = src.v;
  const std::vector<int32_t> p0 = src.positions;
  // Rows across heads (capacity 5): head 0's slot 3 to slot 1, head 1's slot 2 to slot 0.
  const std::vector<int64_t> from = {3, 7}, to = {1, 5};
  kvbench::move_rows_cpu(GatherTarget{src.k.data(), src.v.data(), src.positions.data(), 5}, 2, 2,
                         from.data(), to.data(), 2);
  std::vector<float> expected_k = k0, expected_v = v0;
  std::vector<int32_t> expected_p = p0;
  for (size_t i = 0; i < from.size(); ++i) {
    for (int d = 0; d < 2; ++d) {
      expected_k[to[i] * 2 + d] = k0[from[i] * 2 + d];
      expected_v[to[i] * 2 + d] = v0[from[i] * 2 + d];
    }
    expected_p[to[i]] = p0[from[i]];
  }
  // NaN slack compares unequal to itself: compare bit patterns.
  CHECK(std::memcmp(src.k.data(), expected_k.data(), k0.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(src.v.data(), expected_v.data(), v0.size() * sizeof(float)) == 0);
  CHECK(src.positions == expected_p);
  CHECK(src.positions[1] == 9);
  CHECK(src.positions[5] == 106);
  kvbench::move_rows_cpu(GatherTarget{src.k.data(), src.v.data(), src.positions.data(), 5}, 2, 2,
                         nullptr, nullptr, 0);  // no moves: nothing read
}

TEST_CASE("move_rows_cpu rejects bad moves before writing anything", "[unit]") {
  Source src;
  const Source untouched;
  const GatherTarget rows{src.k.data(), src.v.data(), src.positions.data(), 5};
  const auto rejects = [&](std::vector<int64_t> from, std::vector<int64_t> to) {
    CHECK_THROWS_AS(kvbench::move_rows_cpu(rows, 2, 2, from.data(), to.data(),
                                           static_cast<int64_t>(from.size())),
                    std::invalid_argument);
  };
  rejects({3, 10}, {1, 2});  // a source past the last row (2 heads x 5)
  rejects({3, 4}, {-1, 2});  // a destination before the first
  rejects({3, 1}, {1, 0});   // row 1 is written and read: the device would race
  rejects({3, 4}, {2, 2});   // two writes of one row race too
  const int64_t row = 0;
  CHECK_THROWS_AS(kvbench::move_rows_cpu(rows, 2, 2, &row, &row, -1), std::invalid_argument);
  CHECK(std::memcmp(src.k.data(), untouched.k.data(), src.k.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(src.v.data(), untouched.v.data(), src.v.size() * sizeof(float)) == 0);
  CHECK(src.positions == untouched.positions);
}

TEST_CASE("DenseKv's accessors step heads by capacity, not n_tokens, and check bounds", "[unit]") {
  // 2 heads, room for 5 tokens each, 3 stored: head 1's tokens start at row 5, not 3.
  const int32_t head_dim = 2;
  std::vector<float> k(2 * 5 * head_dim), v(k.size());
  std::vector<int32_t> pos(2 * 5);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i);
    v[i] = -static_cast<float>(i);
  }
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(100 + i);
  const DenseKv kv{k.data(), v.data(), pos.data(), 2, head_dim, /*capacity=*/5, /*n_tokens=*/3};
  CHECK(kv.key(1, 0) == k.data() + 5 * head_dim);
  CHECK(kv.value(1, 2) == v.data() + 7 * head_dim);
  CHECK(kv.position(1, 2) == 107);
  CHECK(kv.position(0, 2) == 102);
  // A stride of n_tokens would read head 0's rows for head 1's first tokens.
  CHECK(kv.key(1, 0)[0] != k[3 * head_dim]);
  CHECK_THROWS_AS(kv.key(0, 3), std::out_of_range);  // a slot past n_tokens, inside capacity
  CHECK_THROWS_AS(kv.value(2, 0), std::out_of_range);
  CHECK_THROWS_AS(kv.position(-1, 0), std::out_of_range);
  CHECK_THROWS_AS(kv.key(0, -1), std::out_of_range);
}
