// The ATen bindings on CUDA tensors against the same bindings on CPU tensors (the CPU
// kernels), over odd sizes. Built only against a CUDA libtorch; without a CUDA device every
// case prints "no CUDA device: skipped" and exits 77 (ctest SKIP).
#include <ATen/ops/zeros.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "aten_tensors.h"
#include "cuda_device.h"
#include "kernels/aten/kernel_ops.h"
#include "page_picks.h"
#include "random_floats.h"

namespace {

using kvbench::testing::AttentionProblem;
using kvbench::testing::Case;
using kvbench::testing::kv_tensors;
using kvbench::testing::max_abs_diff;
using kvbench::testing::q_positions_tensor;
using kvbench::testing::q_tensor;
using kvbench::testing::random_floats;
using kvbench::testing::require_device;
using kvbench::testing::tensor_of;
using kvbench::testing::vector_of;
namespace aten = kvbench::aten;

aten::KvTensors on_cuda(const aten::KvTensors& kv) {
  return aten::KvTensors{kv.k.cuda(), kv.v.cuda(), kv.positions.cuda(), kv.n_tokens};
}

}  // namespace

TEST_CASE("aten CUDA attention equals the CPU binding", "[gpu]") {
  require_device();
  REQUIRE(aten::cuda_bindings_built());
  for (const Case c : {Case{9, 3, 64, 1, 1}, Case{9, 3, 64, 4097, 1, true},
                       Case{32, 8, 128, 1000, 17}}) {
    AttentionProblem p(c);
    const aten::KvTensors kv = kv_tensors(p);
    const at::Tensor q = q_tensor(p), qp = q_positions_tensor(p);
    const at::Tensor cpu = aten::attention_dense(q, qp, kv, p.query.scale);
    const at::Tensor gpu = aten::attention_dense(q.cuda(), qp.cuda(), on_cuda(kv), p.query.scale);
    CHECK(gpu.is_cuda());
    CHECK(max_abs_diff(vector_of<float>(gpu), vector_of<float>(cpu)) < 1e-4f);

    int n_selected = 0;
    const std::vector<int32_t> picks = kvbench::testing::pick_pages(
        kvbench::testing::Pick::Random, c.n_kv_heads, kvbench::testing::pages_of(c.n_tokens, 16),
        7, n_selected);
    const at::Tensor pages = tensor_of(picks, {c.n_kv_heads, n_selected});
    const at::Tensor cpu_pages = aten::attention_pages(q, qp, kv, pages, 16, p.query.scale);
    const at::Tensor gpu_pages =
        aten::attention_pages(q.cuda(), qp.cuda(), on_cuda(kv), pages.cuda(), 16, p.query.scale);
    CHECK(max_abs_diff(vector_of<float>(gpu_pages), vector_of<float>(cpu_pages)) < 1e-4f);
  }
}

TEST_CASE("aten CUDA scores, selection and gather equal the CPU bindings", "[gpu]") {
  require_device();
  AttentionProblem p(Case{9, 3, 64, 517, 33, true});
  const aten::KvTensors kv = kv_tensors(p), kv_gpu = on_cuda(kv);
  const at::Tensor q = q_tensor(p), qp = q_positions_tensor(p);

  at::Tensor scores = at::zeros({9, 517});
  at::Tensor scores_gpu = scores.cuda();
  aten::attention_scores(q, qp, kv, p.query.scale, scores);
  aten::attention_scores(q.cuda(), qp.cuda(), kv_gpu, p.query.scale, scores_gpu);
  CHECK(max_abs_diff(vector_of<float>(scores_gpu), vector_of<float>(scores)) < 1e-4f);
  CHECK(max_abs_diff(vector_of<float>(aten::key_norms(kv_gpu)),
                     vector_of<float>(aten::key_norms(kv))) < 1e-4f);
  CHECK(max_abs_diff(vector_of<float>(aten::key_anchor_cosine(kv_gpu)),
                     vector_of<float>(aten::key_anchor_cosine(kv))) < 1e-4f);

  const at::Tensor values = tensor_of(random_floats(3 * 4099, 2), {3, 4099});
  CHECK(vector_of<int32_t>(aten::top_k_indices(values.cuda(), 333)) ==
        vector_of<int32_t>(aten::top_k_indices(values, 333)));

  const at::Tensor slots = aten::top_k_indices(scores.narrow(0, 0, 3).contiguous(), 100);
  const aten::KvTensors kept = aten::gather_rows(kv, slots);
  const aten::KvTensors kept_gpu = aten::gather_rows(kv_gpu, slots.cuda());
  CHECK(vector_of<float>(kept_gpu.k) == vector_of<float>(kept.k));
  CHECK(vector_of<float>(kept_gpu.v) == vector_of<float>(kept.v));
  CHECK(vector_of<int32_t>(kept_gpu.positions) == vector_of<int32_t>(kept.positions));
}

TEST_CASE("aten CUDA quantization and page bounds equal the CPU bindings", "[gpu]") {
  require_device();
  for (const int bits : {2, 4}) {
    const at::Tensor x = tensor_of(random_floats(97 * 128, 3), {97, 128});
    const aten::QuantizedTensors q = aten::quantize_groups(x, 97 * 4, 32, bits, 32, 1);
    const aten::QuantizedTensors q_gpu = aten::quantize_groups(x.cuda(), 97 * 4, 32, bits, 32, 1);
    CHECK(vector_of<uint8_t>(q_gpu.packed) == vector_of<uint8_t>(q.packed));
    CHECK(max_abs_diff(vector_of<float>(q_gpu.scale), vector_of<float>(q.scale)) < 1e-6f);
  }
  AttentionProblem p(Case{9, 3, 64, 70, 2});
  const at::Tensor keys = tensor_of(random_floats(70 * 3 * 64, 4), {70, 3, 64});
  aten::PageBoundsTensors cpu{at::zeros({3, 5, 64}), at::zeros({3, 5, 64}), 16, 0};
  aten::PageBoundsTensors gpu{cpu.k_min.cuda(), cpu.k_max.cuda(), 16, 0};
  aten::page_bounds_append(cpu, keys, 0);
  aten::page_bounds_append(gpu, keys.cuda(), 0);
  CHECK(gpu.n_pages == cpu.n_pages);
  CHECK(vector_of<float>(gpu.k_min) == vector_of<float>(cpu.k_min));
  const at::Tensor q = q_tensor(p), qp = q_positions_tensor(p);
  CHECK(max_abs_diff(vector_of<float>(aten::page_scores(q.cuda(), qp.cuda(), 1, gpu)),
                     vector_of<float>(aten::page_scores(q, qp, 1, cpu))) < 1e-4f);
}
