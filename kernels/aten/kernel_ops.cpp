#include "kernels/aten/kernel_ops.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/gather.h"
#include "kernels/cpu/merge.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/quest.h"
#include "kernels/cpu/scores.h"

#ifdef KVBENCH_ATEN_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/gather.h"
#include "kernels/cuda/merge.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/quest.h"
#include "kernels/cuda/scores.h"
#endif

namespace kvbench::aten {

namespace {

// Requires a contiguous tensor of `dtype` with `dims` dimensions.
void check_tensor(const char* fn, const char* name, const at::Tensor& t, at::ScalarType dtype,
                  int64_t dims) {
  TORCH_CHECK(t.defined(), fn, ": ", name, " is undefined");
  TORCH_CHECK(t.scalar_type() == dtype, fn, ": ", name, " must be ", c10::toString(dtype),
              ", not ", c10::toString(t.scalar_type()));
  TORCH_CHECK(t.dim() == dims, fn, ": ", name, " must have ", dims, " dimensions, not ", t.dim());
  TORCH_CHECK(t.is_contiguous(), fn, ": ", name, " must be contiguous");
}

// Every tensor on one device, CPU or CUDA; true for CUDA.
bool on_cuda(const char* fn, std::initializer_list<const at::Tensor*> tensors) {
  const at::Device device = (*tensors.begin())->device();
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(t->device() == device, fn, ": tensors on ", device.str(), " and ",
                t->device().str());
  }
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), fn, ": tensors on ", device.str(),
              ": only CPU and CUDA tensors are supported");
#ifndef KVBENCH_ATEN_CUDA
  TORCH_CHECK(device.is_cpu(), fn, ": CUDA tensors need kvbench built against a CUDA libtorch");
#endif
  return device.is_cuda();
}

#ifdef KVBENCH_ATEN_CUDA
// Runs on the tensor's device and its current stream, as ATen's own ops do.
struct OnDevice {
  c10::cuda::CUDAGuard guard;
  cudaStream_t stream;
  explicit OnDevice(const at::Tensor& t)
      : guard(t.device()), stream(c10::cuda::getCurrentCUDAStream(t.device().index()).stream()) {}
};
#define KVBENCH_ON_CUDA(tensor, call) \
  do {                                \
    OnDevice on_device(tensor);       \
    call;                             \
  } while (0)
#else
#define KVBENCH_ON_CUDA(tensor, call) TORCH_CHECK(false, "unreachable: no CUDA bindings")
#endif

DenseKv dense_kv(const char* fn, const KvTensors& kv) {
  check_tensor(fn, "k", kv.k, at::kFloat, 3);
  check_tensor(fn, "v", kv.v, at::kFloat, 3);
  check_tensor(fn, "positions", kv.positions, at::kInt, 2);
  TORCH_CHECK(kv.v.sizes() == kv.k.sizes(), fn, ": v ", kv.v.sizes(), " differs from k ",
              kv.k.sizes());
  TORCH_CHECK(kv.positions.size(0) == kv.k.size(0) && kv.positions.size(1) == kv.k.size(1), fn,
              ": positions ", kv.positions.sizes(), " do not match k ", kv.k.sizes());
  TORCH_CHECK(kv.n_tokens >= 0 && kv.n_tokens <= kv.k.size(1), fn, ": n_tokens ", kv.n_tokens,
              " outside [0, capacity ", kv.k.size(1), "]");
  return DenseKv{kv.k.data_ptr<float>(),
                 kv.v.data_ptr<float>(),
                 kv.positions.data_ptr<int32_t>(),
                 static_cast<int32_t>(kv.k.size(0)),
                 static_cast<int32_t>(kv.k.size(2)),
                 kv.k.size(1),
                 kv.n_tokens};
}

// The query of q [n, n_heads, head_dim] against kv, writing `out` (may be undefined).
AttentionQuery attention_query(const char* fn, const at::Tensor& q, const at::Tensor& q_positions,
                               const DenseKv& kv, double scale, at::Tensor* out) {
  check_tensor(fn, "q", q, at::kFloat, 3);
  check_tensor(fn, "q_positions", q_positions, at::kInt, 1);
  TORCH_CHECK(q_positions.size(0) == q.size(0), fn, ": ", q.size(0), " queries but ",
              q_positions.size(0), " positions");
  TORCH_CHECK(q.size(2) == kv.head_dim, fn, ": q's head_dim ", q.size(2), " differs from the KV's ",
              kv.head_dim);
  TORCH_CHECK(kv.n_kv_heads > 0 && q.size(1) % kv.n_kv_heads == 0, fn, ": ", q.size(1),
              " query heads are not a multiple of ", kv.n_kv_heads, " KV heads");
  return AttentionQuery{q.data_ptr<float>(),
                        q_positions.data_ptr<int32_t>(),
                        out ? out->data_ptr<float>() : nullptr,
                        static_cast<int32_t>(q.size(0)),
                        static_cast<int32_t>(q.size(1)),
                        static_cast<float>(scale)};
}

}  // namespace

bool cuda_bindings_built() {
#ifdef KVBENCH_ATEN_CUDA
  return true;
#else
  return false;
#endif
}

at::Tensor attention_dense(const at::Tensor& q, const at::Tensor& q_positions,
                           const KvTensors& kv, double scale) {
  const char* fn = "attention_dense";
  const DenseKv dense = dense_kv(fn, kv);
  at::Tensor out = at::empty(q.sizes(), q.options());
  const AttentionQuery query = attention_query(fn, q, q_positions, dense, scale, &out);
  if (on_cuda(fn, {&q, &q_positions, &kv.k, &kv.v, &kv.positions})) {
    KVBENCH_ON_CUDA(q, attention_dense_cuda(query, dense, on_device.stream));
  } else {
    attention_dense_cpu(query, dense);
  }
  return out;
}

at::Tensor attention_pages(const at::Tensor& q, const at::Tensor& q_positions,
                           const KvTensors& kv, const at::Tensor& pages, int64_t page_tokens,
                           double scale) {
  const char* fn = "attention_pages";
  const DenseKv dense = dense_kv(fn, kv);
  check_tensor(fn, "pages", pages, at::kInt, 2);
  TORCH_CHECK(pages.size(0) == dense.n_kv_heads, fn, ": pages has ", pages.size(0),
              " rows for ", dense.n_kv_heads, " KV heads");
  TORCH_CHECK(page_tokens > 0, fn, ": page_tokens must be positive, not ", page_tokens);
  at::Tensor out = at::empty(q.sizes(), q.options());
  const AttentionQuery query = attention_query(fn, q, q_positions, dense, scale, &out);
  const PageSelection selection{pages.data_ptr<int32_t>(), static_cast<int32_t>(pages.size(1)),
                                static_cast<int32_t>(page_tokens)};
  if (on_cuda(fn, {&q, &q_positions, &kv.k, &kv.v, &kv.positions, &pages})) {
    KVBENCH_ON_CUDA(q, attention_pages_cuda(query, dense, selection, on_device.stream));
  } else {
    attention_pages_cpu(query, dense, selection);
  }
  return out;
}

void attention_scores(const at::Tensor& q, const at::Tensor& q_positions, const KvTensors& kv,
                      double scale, at::Tensor& scores) {
  const char* fn = "attention_scores";
  const DenseKv dense = dense_kv(fn, kv);
  const AttentionQuery query = attention_query(fn, q, q_positions, dense, scale, nullptr);
  check_tensor(fn, "scores", scores, at::kFloat, 2);
  TORCH_CHECK(scores.size(0) == q.size(1) && scores.size(1) == dense.n_tokens, fn, ": scores ",
              scores.sizes(), " must be [", q.size(1), ", ", dense.n_tokens, "]");
  float* out = scores.data_ptr<float>();
  if (on_cuda(fn, {&q, &q_positions, &kv.k, &kv.v, &kv.positions, &scores})) {
    KVBENCH_ON_CUDA(q, attention_scores_cuda(query, dense, out, on_device.stream));
  } else {
    attention_scores_cpu(query, dense, out);
  }
}

at::Tensor key_norms(const KvTensors& kv) {
  const char* fn = "key_norms";
  const DenseKv dense = dense_kv(fn, kv);
  at::Tensor norms = at::empty({dense.n_kv_heads, dense.n_tokens}, kv.k.options());
  if (on_cuda(fn, {&kv.k, &kv.v, &kv.positions})) {
    KVBENCH_ON_CUDA(kv.k, key_norms_cuda(dense, norms.data_ptr<float>(), on_device.stream));
  } else {
    key_norms_cpu(dense, norms.data_ptr<float>());
  }
  return norms;
}

at::Tensor key_anchor_cosine(const KvTensors& kv) {
  const char* fn = "key_anchor_cosine";
  const DenseKv dense = dense_kv(fn, kv);
  at::Tensor cosine = at::empty({dense.n_kv_heads, dense.n_tokens}, kv.k.options());
  if (on_cuda(fn, {&kv.k, &kv.v, &kv.positions})) {
    KVBENCH_ON_CUDA(kv.k,
                    key_anchor_cosine_cuda(dense, cosine.data_ptr<float>(), on_device.stream));
  } else {
    key_anchor_cosine_cpu(dense, cosine.data_ptr<float>());
  }
  return cosine;
}

at::Tensor top_k_indices(const at::Tensor& values, int64_t k) {
  const char* fn = "top_k_indices";
  check_tensor(fn, "values", values, at::kFloat, 2);
  const int64_t rows = values.size(0), n = values.size(1);
  TORCH_CHECK(k >= 0 && k <= n, fn, ": k ", k, " outside [0, ", n, "]");
  at::Tensor out = at::empty({rows, k}, values.options().dtype(at::kInt));
  if (on_cuda(fn, {&values})) {
    KVBENCH_ON_CUDA(values, top_k_indices_cuda(values.data_ptr<float>(), rows, n, k,
                                               out.data_ptr<int32_t>(), on_device.stream));
  } else {
    top_k_indices_cpu(values.data_ptr<float>(), rows, n, k, out.data_ptr<int32_t>());
  }
  return out;
}

KvTensors gather_rows(const KvTensors& kv, const at::Tensor& slots) {
  const char* fn = "gather_rows";
  const DenseKv dense = dense_kv(fn, kv);
  check_tensor(fn, "slots", slots, at::kInt, 2);
  TORCH_CHECK(slots.size(0) == dense.n_kv_heads, fn, ": slots has ", slots.size(0),
              " rows for ", dense.n_kv_heads, " KV heads");
  const int64_t n_keep = slots.size(1);
  KvTensors out{at::empty({dense.n_kv_heads, n_keep, dense.head_dim}, kv.k.options()),
                at::empty({dense.n_kv_heads, n_keep, dense.head_dim}, kv.v.options()),
                at::empty({dense.n_kv_heads, n_keep}, kv.positions.options()), n_keep};
  const GatherTarget target{out.k.data_ptr<float>(), out.v.data_ptr<float>(),
                            out.positions.data_ptr<int32_t>(), n_keep};
  if (on_cuda(fn, {&kv.k, &kv.v, &kv.positions, &slots})) {
    KVBENCH_ON_CUDA(kv.k, gather_rows_cuda(dense, slots.data_ptr<int32_t>(), n_keep, target,
                                           on_device.stream));
  } else {
    gather_rows_cpu(dense, slots.data_ptr<int32_t>(), n_keep, target);
  }
  return out;
}

namespace {

// The last element a group layout reads, +1: x must hold at least this many.
int64_t group_extent(int64_t n_groups, int32_t group_size, int64_t group_stride,
                     int64_t element_stride) {
  if (n_groups == 0) return 0;
  return (n_groups - 1) * group_stride + (group_size - 1) * element_stride + 1;
}

QuantGroups quant_groups(const char* fn, const QuantizedTensors& q) {
  TORCH_CHECK(q.bits == 2 || q.bits == 4, fn, ": bits must be 2 or 4, not ", q.bits);
  TORCH_CHECK(q.group_size > 0 && q.group_size * q.bits % 8 == 0, fn, ": group_size ",
              q.group_size, " times bits must be a positive multiple of 8");
  check_tensor(fn, "packed", q.packed, at::kByte, 2);
  check_tensor(fn, "scale", q.scale, at::kFloat, 1);
  check_tensor(fn, "min", q.min, at::kFloat, 1);
  const int64_t n_groups = q.packed.size(0);
  TORCH_CHECK(q.packed.size(1) == q.group_size * q.bits / 8 && q.scale.size(0) == n_groups &&
                  q.min.size(0) == n_groups,
              fn, ": packed ", q.packed.sizes(), ", scale ", q.scale.sizes(), " and min ",
              q.min.sizes(), " do not describe the same groups");
  return QuantGroups{q.packed.data_ptr<uint8_t>(), q.scale.data_ptr<float>(),
                     q.min.data_ptr<float>(), n_groups, q.group_size, q.bits};
}

}  // namespace

QuantizedTensors quantize_groups(const at::Tensor& x, int64_t n_groups, int32_t group_size,
                                 int32_t bits, int64_t group_stride, int64_t element_stride) {
  const char* fn = "quantize_groups";
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), fn,
              ": x must be contiguous float32");
  TORCH_CHECK(n_groups >= 0 && group_stride >= 0 && element_stride >= 0, fn,
              ": n_groups and strides must not be negative");
  TORCH_CHECK(group_extent(n_groups, group_size, group_stride, element_stride) <= x.numel(), fn,
              ": ", n_groups, " groups at these strides read past x's ", x.numel(), " elements");
  const auto bytes = x.options().dtype(at::kByte);
  QuantizedTensors q{at::empty({n_groups, static_cast<int64_t>(group_size) * bits / 8}, bytes),
                     at::empty({n_groups}, x.options()), at::empty({n_groups}, x.options()),
                     group_size, bits};
  const QuantGroups groups = quant_groups(fn, q);
  if (on_cuda(fn, {&x})) {
    KVBENCH_ON_CUDA(x, quantize_groups_cuda(x.data_ptr<float>(), group_stride, element_stride,
                                            groups, on_device.stream));
  } else {
    quantize_groups_cpu(x.data_ptr<float>(), group_stride, element_stride, groups);
  }
  return q;
}

void dequantize_groups(const QuantizedTensors& q, at::Tensor& x, int64_t group_stride,
                       int64_t element_stride) {
  const char* fn = "dequantize_groups";
  const QuantGroups groups = quant_groups(fn, q);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous(), fn,
              ": x must be contiguous float32");
  TORCH_CHECK(group_stride >= 0 && element_stride >= 0, fn, ": strides must not be negative");
  TORCH_CHECK(group_extent(groups.n_groups, groups.group_size, group_stride, element_stride) <=
                  x.numel(),
              fn, ": ", groups.n_groups, " groups at these strides write past x's ", x.numel(),
              " elements");
  if (on_cuda(fn, {&x, &q.packed, &q.scale, &q.min})) {
    KVBENCH_ON_CUDA(x, dequantize_groups_cuda(groups, x.data_ptr<float>(), group_stride,
                                              element_stride, on_device.stream));
  } else {
    dequantize_groups_cpu(groups, x.data_ptr<float>(), group_stride, element_stride);
  }
}

at::Tensor adjacent_key_cosine(const KvTensors& kv, const at::Tensor& order) {
  const char* fn = "adjacent_key_cosine";
  const DenseKv dense = dense_kv(fn, kv);
  check_tensor(fn, "order", order, at::kInt, 2);
  TORCH_CHECK(order.size(0) == dense.n_kv_heads && order.size(1) == dense.n_tokens, fn,
              ": order ", order.sizes(), " must be [", dense.n_kv_heads, ", ", dense.n_tokens, "]");
  at::Tensor sim = at::empty({dense.n_kv_heads, dense.n_tokens}, kv.k.options());
  if (on_cuda(fn, {&kv.k, &kv.v, &kv.positions, &order})) {
    KVBENCH_ON_CUDA(kv.k, adjacent_key_cosine_cuda(dense, order.data_ptr<int32_t>(),
                                                   sim.data_ptr<float>(), on_device.stream));
  } else {
    adjacent_key_cosine_cpu(dense, order.data_ptr<int32_t>(), sim.data_ptr<float>());
  }
  return sim;
}

namespace {

PageBounds page_bounds(const char* fn, const PageBoundsTensors& b) {
  check_tensor(fn, "k_min", b.k_min, at::kFloat, 3);
  check_tensor(fn, "k_max", b.k_max, at::kFloat, 3);
  TORCH_CHECK(b.k_max.sizes() == b.k_min.sizes(), fn, ": k_max ", b.k_max.sizes(),
              " differs from k_min ", b.k_min.sizes());
  TORCH_CHECK(b.page_tokens > 0, fn, ": page_tokens must be positive, not ", b.page_tokens);
  TORCH_CHECK(b.n_pages >= 0 && b.n_pages <= b.k_min.size(1), fn, ": n_pages ", b.n_pages,
              " outside [0, page_capacity ", b.k_min.size(1), "]");
  return PageBounds{b.k_min.data_ptr<float>(),
                    b.k_max.data_ptr<float>(),
                    static_cast<int32_t>(b.k_min.size(0)),
                    static_cast<int32_t>(b.k_min.size(2)),
                    b.page_tokens,
                    b.k_min.size(1),
                    b.n_pages};
}

}  // namespace

void page_bounds_append(PageBoundsTensors& bounds, const at::Tensor& k, int64_t first_slot) {
  const char* fn = "page_bounds_append";
  PageBounds pb = page_bounds(fn, bounds);
  check_tensor(fn, "k", k, at::kFloat, 3);
  TORCH_CHECK(k.size(1) == pb.n_kv_heads && k.size(2) == pb.head_dim, fn, ": k ", k.sizes(),
              " must be [n_new, ", pb.n_kv_heads, ", ", pb.head_dim, "]");
  const int64_t n_new = k.size(0);
  TORCH_CHECK(first_slot >= 0, fn, ": first_slot must not be negative");
  TORCH_CHECK((first_slot + n_new + pb.page_tokens - 1) / pb.page_tokens <= pb.page_capacity, fn,
              ": slots up to ", first_slot + n_new, " need more than the ", pb.page_capacity,
              " pages k_min holds");
  if (on_cuda(fn, {&k, &bounds.k_min, &bounds.k_max})) {
    KVBENCH_ON_CUDA(k, page_bounds_append_cuda(pb, k.data_ptr<float>(), first_slot, n_new,
                                               on_device.stream));
  } else {
    page_bounds_append_cpu(pb, k.data_ptr<float>(), first_slot, n_new);
  }
  bounds.n_pages = pb.n_pages;
}

at::Tensor page_scores(const at::Tensor& q, const at::Tensor& q_positions, int64_t row,
                       const PageBoundsTensors& bounds) {
  const char* fn = "page_scores";
  const PageBounds pb = page_bounds(fn, bounds);
  check_tensor(fn, "q", q, at::kFloat, 3);
  check_tensor(fn, "q_positions", q_positions, at::kInt, 1);
  TORCH_CHECK(q.size(2) == pb.head_dim && q.size(1) % pb.n_kv_heads == 0, fn, ": q ", q.sizes(),
              " does not match bounds of ", pb.n_kv_heads, " KV heads of ", pb.head_dim);
  TORCH_CHECK(row >= 0 && row < q.size(0), fn, ": row ", row, " outside [0, ", q.size(0), ")");
  const AttentionQuery query{q.data_ptr<float>(), q_positions.data_ptr<int32_t>(), nullptr,
                             static_cast<int32_t>(q.size(0)), static_cast<int32_t>(q.size(1)),
                             1.0f};
  at::Tensor scores = at::empty({pb.n_kv_heads, pb.n_pages}, q.options());
  if (on_cuda(fn, {&q, &q_positions, &bounds.k_min, &bounds.k_max})) {
    KVBENCH_ON_CUDA(q, page_scores_cuda(query, static_cast<int32_t>(row), pb,
                                        scores.data_ptr<float>(), on_device.stream));
  } else {
    page_scores_cpu(query, static_cast<int32_t>(row), pb, scores.data_ptr<float>());
  }
  return scores;
}

}  // namespace kvbench::aten
