// The ATen bindings (kernels/aten) on CPU tensors: each gives what its kernel's reference
// gives on the same memory, and bad arguments are refused with an error naming the function
// and the argument (the plumbing from tensors to layout structs is what can go wrong here).
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "aten_tensors.h"
#include "kernels/aten/kernel_ops.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/quest.h"
#include "kernels/cpu/scores.h"
#include "page_picks.h"
#include "random_floats.h"

namespace {

using kvbench::AttentionQuery;
using kvbench::DenseKv;
using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;
using kvbench::testing::kv_tensors;
using kvbench::testing::max_abs_diff;
using kvbench::testing::q_positions_tensor;
using kvbench::testing::q_tensor;
using kvbench::testing::random_floats;
using kvbench::testing::tensor_of;
using kvbench::testing::vector_of;
namespace aten = kvbench::aten;

// The c10::Error's message must name the function and the problem.
template <class F>
void require_refused(F&& call, const std::string& fn, const std::string& what) {
  try {
    call();
    FAIL("expected " << fn << " to refuse: " << what);
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find(fn) != std::string::npos);
    CHECK(message.find(what) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("aten attention_dense and attention_pages match the references", "[unit]") {
  for (const Case c : {Case{9, 3, 64, 1, 1}, Case{9, 3, 64, 77, 5, true}, Case{8, 2, 128, 300, 3}}) {
    AttentionProblem p(c);
    const aten::KvTensors kv = kv_tensors(p);
    const at::Tensor out =
        aten::attention_dense(q_tensor(p), q_positions_tensor(p), kv, p.query.scale);
    CHECK(out.sizes() == at::IntArrayRef({c.n_queries, c.n_heads, c.head_dim}));
    CHECK(max_abs_diff(vector_of<float>(out), p.run(kvbench::attention_dense_reference)) < 1e-5f);

    const int page_tokens = 16;
    int n_selected = 0;
    const std::vector<int32_t> picks =
        kvbench::testing::pick_pages(kvbench::testing::Pick::Alternate, c.n_kv_heads,
                                     kvbench::testing::pages_of(c.n_tokens, page_tokens), 3,
                                     n_selected);
    const at::Tensor paged =
        aten::attention_pages(q_tensor(p), q_positions_tensor(p), kv,
                              tensor_of(picks, {c.n_kv_heads, n_selected}), page_tokens,
                              p.query.scale);
    std::vector<float> expected(p.q.size());
    AttentionQuery query = p.query;
    query.out = expected.data();
    kvbench::attention_pages_reference(
        query, p.kv, kvbench::PageSelection{picks.data(), n_selected, page_tokens});
    CHECK(max_abs_diff(vector_of<float>(paged), expected) < 1e-5f);
  }
}

TEST_CASE("aten scores, norms and cosines match the kernels' references", "[unit]") {
  AttentionProblem p(Case{9, 3, 64, 133, 7, true});
  const aten::KvTensors kv = kv_tensors(p);
  const int64_t n = p.kv.n_tokens;

  at::Tensor scores = at::zeros({9, n});
  aten::attention_scores(q_tensor(p), q_positions_tensor(p), kv, p.query.scale, scores);
  aten::attention_scores(q_tensor(p), q_positions_tensor(p), kv, p.query.scale, scores);
  std::vector<float> expected(9 * n, 0.0f);
  kvbench::attention_scores_reference(p.query, p.kv, expected.data());
  kvbench::attention_scores_reference(p.query, p.kv, expected.data());  // it adds
  CHECK(max_abs_diff(vector_of<float>(scores), expected) < 1e-4f);

  std::vector<float> norms(3 * n);
  for (int h = 0; h < 3; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      double sum = 0;
      for (int d = 0; d < 64; ++d) {
        const double x = p.k[(h * p.kv.capacity + t) * 64 + d];
        sum += x * x;
      }
      norms[h * n + t] = static_cast<float>(std::sqrt(sum));
    }
  }
  CHECK(max_abs_diff(vector_of<float>(aten::key_norms(kv)), norms) < 1e-4f);

  std::vector<float> cosine(3 * n);
  kvbench::key_anchor_cosine_cpu(p.kv, cosine.data());
  CHECK(max_abs_diff(vector_of<float>(aten::key_anchor_cosine(kv)), cosine) == 0.0f);

  std::vector<int32_t> order(3 * n);
  for (int h = 0; h < 3; ++h) {
    int32_t* row = order.data() + h * n;
    std::iota(row, row + n, 0);
    const int32_t* pos = p.positions.data() + h * p.kv.capacity;
    std::sort(row, row + n, [&](int32_t a, int32_t b) { return pos[a] < pos[b]; });
  }
  std::vector<float> sim(3 * n);
  kvbench::adjacent_key_cosine_reference(p.kv, order.data(), sim.data());
  CHECK(max_abs_diff(vector_of<float>(aten::adjacent_key_cosine(kv, tensor_of(order, {3, n}))),
                     sim) < 1e-5f);
}

TEST_CASE("aten top_k_indices and gather_rows keep what they should", "[unit]") {
  const std::vector<float> values = random_floats(3 * 101, 5);
  const at::Tensor top = aten::top_k_indices(tensor_of(values, {3, 101}), 10);
  REQUIRE(top.sizes() == at::IntArrayRef({3, 10}));
  const std::vector<int32_t> got = vector_of<int32_t>(top);
  for (int r = 0; r < 3; ++r) {
    std::vector<int32_t> idx(101);
    std::iota(idx.begin(), idx.end(), 0);
    const float* row = values.data() + r * 101;
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    idx.resize(10);
    std::sort(idx.begin(), idx.end());
    CHECK(std::vector<int32_t>(got.begin() + r * 10, got.begin() + r * 10 + 10) == idx);
  }

  AttentionProblem p(Case{9, 3, 64, 50, 1});
  const std::vector<int32_t> slots = {0, 7, 49, 3, 4, 5, 10, 20, 30};  // 3 per head
  const aten::KvTensors kept = aten::gather_rows(kv_tensors(p), tensor_of(slots, {3, 3}));
  CHECK(kept.n_tokens == 3);
  const std::vector<float> k = vector_of<float>(kept.k);
  const std::vector<int32_t> pos = vector_of<int32_t>(kept.positions);
  for (int h = 0; h < 3; ++h) {
    for (int j = 0; j < 3; ++j) {
      const int64_t from = h * p.kv.capacity + slots[h * 3 + j];
      CHECK(pos[h * 3 + j] == p.positions[from]);
      CHECK(std::equal(k.begin() + (h * 3 + j) * 64, k.begin() + (h * 3 + j + 1) * 64,
                       p.k.begin() + from * 64));
    }
  }
}

TEST_CASE("aten group quantization round-trips within half a step", "[unit]") {
  for (const int bits : {2, 4}) {
    // Values quantized per token in groups of 32 channels (KIVI's values): 40 tokens x 64.
    const std::vector<float> x = random_floats(40 * 64, 9);
    const aten::QuantizedTensors q =
        aten::quantize_groups(tensor_of(x, {40, 64}), 80, 32, bits, 32, 1);
    CHECK(q.packed.sizes() == at::IntArrayRef({80, 32 * bits / 8}));
    at::Tensor back = at::empty({40, 64});
    aten::dequantize_groups(q, back, 32, 1);
    const std::vector<float> y = vector_of<float>(back);
    const std::vector<float> scale = vector_of<float>(q.scale);
    for (size_t i = 0; i < x.size(); ++i) {
      REQUIRE(std::fabs(x[i] - y[i]) <= 0.5f * scale[i / 32] + 1e-5f);
    }
  }
}

TEST_CASE("aten page bounds and page scores match the reference", "[unit]") {
  AttentionProblem p(Case{9, 3, 64, 70, 2});
  const std::vector<float> keys = random_floats(70 * 3 * 64, 4);  // projection layout
  aten::PageBoundsTensors bounds{at::empty({3, 5, 64}), at::empty({3, 5, 64}), 16, 0};
  aten::page_bounds_append(bounds, tensor_of(std::vector<float>(keys.begin(), keys.begin() + 20 * 192), {20, 3, 64}), 0);
  aten::page_bounds_append(bounds, tensor_of(std::vector<float>(keys.begin() + 20 * 192, keys.end()), {50, 3, 64}), 20);
  CHECK(bounds.n_pages == 5);

  std::vector<float> k_min(3 * 5 * 64), k_max(3 * 5 * 64);
  kvbench::PageBounds expected{k_min.data(), k_max.data(), 3, 64, 16, 5, 0};
  kvbench::page_bounds_append_cpu(expected, keys.data(), 0, 70);
  CHECK(vector_of<float>(bounds.k_min) == k_min);
  CHECK(vector_of<float>(bounds.k_max) == k_max);

  const at::Tensor scores = aten::page_scores(q_tensor(p), q_positions_tensor(p), 1, bounds);
  std::vector<float> want(3 * 5);
  kvbench::page_scores_reference(p.query, 1, expected, want.data());
  CHECK(max_abs_diff(vector_of<float>(scores), want) < 1e-4f);
}

TEST_CASE("aten bindings refuse bad arguments naming the function", "[unit]") {
  AttentionProblem p(Case{9, 3, 64, 20, 2});
  aten::KvTensors kv = kv_tensors(p);
  const at::Tensor q = q_tensor(p), qp = q_positions_tensor(p);

  aten::KvTensors wrong_dtype = kv;
  wrong_dtype.positions = kv.positions.to(at::kLong);
  require_refused([&] { aten::attention_dense(q, qp, wrong_dtype, 1.0); }, "attention_dense",
                  "positions must be Int");

  aten::KvTensors strided = kv;
  strided.k = kv.k.transpose(1, 2).contiguous().transpose(1, 2);
  require_refused([&] { aten::key_norms(strided); }, "key_norms", "k must be contiguous");

  aten::KvTensors too_many = kv;
  too_many.n_tokens = p.kv.capacity + 1;
  require_refused([&] { aten::key_norms(too_many); }, "key_norms", "n_tokens");

  require_refused([&] { aten::attention_dense(q.narrow(1, 0, 8).contiguous(), qp, kv, 1.0); },
                  "attention_dense", "not a multiple of 3 KV heads");
  require_refused([&] { aten::top_k_indices(tensor_of(random_floats(10, 1), {2, 5}), 6); },
                  "top_k_indices", "outside [0, 5]");
  require_refused([&] { aten::quantize_groups(tensor_of(random_floats(64, 1), {64}), 3, 32, 4, 32, 1); },
                  "quantize_groups", "read past");
  require_refused([&] { aten::quantize_groups(tensor_of(random_floats(64, 1), {64}), 2, 32, 3, 32, 1); },
                  "quantize_groups", "bits must be 2 or 4");
  at::Tensor small = at::zeros({9, 3});
  require_refused([&] { aten::attention_scores(q, qp, kv, 1.0, small); }, "attention_scores",
                  "must be [9, 20]");
}
