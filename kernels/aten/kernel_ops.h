// Thin ATen bindings of the kernels: the same operations on at::Tensor arguments, for code
// that holds its KV in tensors (a PyTorch extension, a notebook, a test). Each checks
// shapes, dtypes and devices, builds the layout struct of kernels/layouts.h over the
// tensors' memory and calls the kernel: kernels/cpu for CPU tensors, and kernels/cuda on
// the tensors' current CUDA stream for CUDA tensors when kvbench was built with a CUDA
// libtorch (KVBENCH_ATEN_CUDA). Bad arguments throw c10::Error naming the function.
// Tensors must be contiguous; float32 for values, int32 for positions, slots and pages.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace kvbench::aten {

// One layer's dense KV in DenseKv's layout: k, v [n_kv_heads, capacity, head_dim],
// positions [n_kv_heads, capacity]; each head's first n_tokens slots hold tokens.
struct KvTensors {
  at::Tensor k, v, positions;
  int64_t n_tokens = 0;
};

// True when CUDA tensors are accepted (kvbench built against a CUDA libtorch).
bool cuda_bindings_built();

// Causal-by-position GQA attention (attention_dense_*): q [n, n_heads, head_dim] with RoPE
// applied, q_positions [n]. Returns [n, n_heads, head_dim].
at::Tensor attention_dense(const at::Tensor& q, const at::Tensor& q_positions,
                           const KvTensors& kv, double scale);

// As attention_dense over the selected pages only (attention_pages_*): pages
// [n_kv_heads, n_selected], each row ascending.
at::Tensor attention_pages(const at::Tensor& q, const at::Tensor& q_positions,
                           const KvTensors& kv, const at::Tensor& pages, int64_t page_tokens,
                           double scale);

// Softmax attention each slot receives, summed over q's rows (attention_scores_*), ADDED
// into scores [n_heads, kv.n_tokens] so H2O-style scores accumulate.
void attention_scores(const at::Tensor& q, const at::Tensor& q_positions, const KvTensors& kv,
                      double scale, at::Tensor& scores);

// L2 norm of each stored key, [n_kv_heads, n_tokens] (key_norms_*).
at::Tensor key_norms(const KvTensors& kv);

// Each key's cosine to its head's mean normalised key, [n_kv_heads, n_tokens] (KeyDiff).
at::Tensor key_anchor_cosine(const KvTensors& kv);

// Indices of each row's k largest values, ascending ([rows, k], int32; ties: lower index).
at::Tensor top_k_indices(const at::Tensor& values, int64_t k);

// Each head's slots [n_kv_heads, n_keep] copied, compacted, into new tensors of capacity
// n_keep (gather_rows_*).
KvTensors gather_rows(const KvTensors& kv, const at::Tensor& slots);

// Group quantization (quantize_groups_*): x holds n_groups groups of group_size values,
// group g's element i at x[g * group_stride + i * element_stride]. Returns codes
// [n_groups, group_size * bits / 8] (uint8), scale and min [n_groups].
struct QuantizedTensors {
  at::Tensor packed, scale, min;
  int32_t group_size = 0;
  int32_t bits = 0;
};
QuantizedTensors quantize_groups(const at::Tensor& x, int64_t n_groups, int32_t group_size,
                                 int32_t bits, int64_t group_stride, int64_t element_stride);
// The inverse, into x (which must have room for every group's elements at those strides).
void dequantize_groups(const QuantizedTensors& q, at::Tensor& x, int64_t group_stride,
                       int64_t element_stride);

// Cosine of each key to the next in position order (adjacent_key_cosine_*): order
// [n_kv_heads, n_tokens]; returns [n_kv_heads, n_tokens], the last of each row 0.
at::Tensor adjacent_key_cosine(const KvTensors& kv, const at::Tensor& order);

// Quest's page bounds: k_min, k_max [n_kv_heads, page_capacity, head_dim], n_pages in use.
struct PageBoundsTensors {
  at::Tensor k_min, k_max;
  int32_t page_tokens = 0;
  int64_t n_pages = 0;
};
// Folds keys k [n_new, n_kv_heads, head_dim] stored at slots [first_slot, ..) into the
// bounds; n_pages grows to cover them (page_capacity must already).
void page_bounds_append(PageBoundsTensors& bounds, const at::Tensor& k, int64_t first_slot);
// Upper bounds of query row `row`'s logits per page, [n_kv_heads, n_pages].
at::Tensor page_scores(const at::Tensor& q, const at::Tensor& q_positions, int64_t row,
                       const PageBoundsTensors& bounds);

}  // namespace kvbench::aten
