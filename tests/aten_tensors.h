// Tensors over the test problems' host vectors, for the ATen binding tests.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include <cstdint>
#include <vector>

#include "attention_problem.h"
#include "kernels/aten/kernel_ops.h"

namespace kvbench::testing {

// A CPU tensor owning a copy of `data`, shaped `sizes`.
inline at::Tensor tensor_of(const std::vector<float>& data, at::IntArrayRef sizes) {
  return at::from_blob(const_cast<float*>(data.data()), sizes, at::kFloat).clone();
}
inline at::Tensor tensor_of(const std::vector<int32_t>& data, at::IntArrayRef sizes) {
  return at::from_blob(const_cast<int32_t*>(data.data()), sizes, at::kInt).clone();
}

template <class T>
std::vector<T> vector_of(const at::Tensor& t) {
  const at::Tensor c = t.cpu().contiguous();
  return std::vector<T>(c.data_ptr<T>(), c.data_ptr<T>() + c.numel());
}

// The problem's KV as tensors (capacity as the problem's, NaN slack included).
inline aten::KvTensors kv_tensors(const AttentionProblem& p) {
  const DenseKv& kv = p.kv;
  return aten::KvTensors{tensor_of(p.k, {kv.n_kv_heads, kv.capacity, kv.head_dim}),
                         tensor_of(p.v, {kv.n_kv_heads, kv.capacity, kv.head_dim}),
                         tensor_of(p.positions, {kv.n_kv_heads, kv.capacity}), kv.n_tokens};
}
inline at::Tensor q_tensor(const AttentionProblem& p) {
  return tensor_of(p.q, {p.query.n_queries, p.query.n_heads, p.kv.head_dim});
}
inline at::Tensor q_positions_tensor(const AttentionProblem& p) {
  return tensor_of(p.q_positions, {p.query.n_queries});
}

}  // namespace kvbench::testing
