#include "methods/cuda/sparse_prefill.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_buffer.h"  // cuda_check

namespace kvbench {
namespace {

constexpr const char* kWho = "SparsePrefillOnDevice";

// Host copy of `rows` rows of `row` elements each, `stride` elements apart on the device.
template <class T>
std::vector<T> copy_rows_down(const T* from, int64_t rows, int64_t row, int64_t stride) {
  std::vector<T> host(static_cast<size_t>(rows * row));
  if (rows > 0 && row > 0) {
    cuda_check(cudaMemcpy2D(host.data(), row * sizeof(T), from, stride * sizeof(T),
                            row * sizeof(T), rows, cudaMemcpyDeviceToHost),
               kWho, "copy to the host");
  }
  return host;
}

template <class T>
std::vector<T> copy_down(const T* from, int64_t n) {
  return copy_rows_down(from, 1, n, n);
}

}  // namespace

AttentionPairs SparsePrefillOnDevice::attend(const AttentionQuery& query, const DenseKv& kv,
                                             int64_t prompt_end) const {
  if (query.n_queries <= 0) return AttentionPairs{};
  const int32_t dim = kv.head_dim;
  // The pattern's inputs on the host: positions always; for MInference's estimate the last
  // last_q query rows (the others stay zero: it reads no other row) and the keys.
  const std::vector<int32_t> q_positions = copy_down(query.q_positions, query.n_queries);
  AttentionQuery host_query = query;
  host_query.q_positions = q_positions.data();
  host_query.out = nullptr;
  std::vector<float> q, k;
  std::vector<int32_t> positions;
  DenseKv host_kv{nullptr, nullptr, nullptr, kv.n_kv_heads, dim, kv.n_tokens, kv.n_tokens};
  if (rule().shape == SparsePrefillRule::Shape::MInference) {
    const int64_t row = static_cast<int64_t>(query.n_heads) * dim;
    const int32_t n_last = std::min(rule().last_q, query.n_queries);
    q.assign(static_cast<size_t>(query.n_queries * row), 0.0f);
    const int64_t first = static_cast<int64_t>(query.n_queries - n_last) * row;
    const std::vector<float> last = copy_down(query.q + first, n_last * row);
    std::copy(last.begin(), last.end(), q.begin() + first);
    k = copy_rows_down(kv.k, kv.n_kv_heads, kv.n_tokens * dim, kv.capacity * dim);
    positions = copy_rows_down(kv.positions, kv.n_kv_heads, kv.n_tokens, kv.capacity);
    host_query.q = q.data();
    host_kv.k = k.data();
    host_kv.positions = positions.data();
  } else {
    host_query.q = nullptr;  // A-shape and Tri-shape read positions alone
  }
  const BuiltPattern built = pattern(host_query, host_kv, prompt_end);
  // The lists go up stream-ordered and are freed after the kernels that read them.
  const int64_t n_columns = static_cast<int64_t>(built.columns.size());
  const int64_t n_lists = n_columns + static_cast<int64_t>(built.offsets.size());
  int32_t* lists = nullptr;
  if (n_lists > 0) {
    cuda_check(
        cudaMallocAsync(reinterpret_cast<void**>(&lists), n_lists * sizeof(int32_t), nullptr),
        kWho, "cudaMallocAsync");
    const auto upload = [&](int32_t* to, const std::vector<int32_t>& list) {
      if (list.empty()) return;
      cuda_check(cudaMemcpyAsync(to, list.data(), list.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, nullptr),
                 kWho, "upload the lists");
    };
    upload(lists, built.columns);
    upload(lists + n_columns, built.offsets);
  }
  SparsePattern on_device = built.pattern;
  on_device.columns = built.columns.empty() ? nullptr : lists;
  on_device.offsets = built.offsets.empty() ? nullptr : lists + n_columns;
  AttentionPairs pairs;
  try {
    pairs = attention_sparse_cuda(query, kv, on_device, nullptr);
  } catch (...) {
    if (lists) cudaFreeAsync(lists, nullptr);
    throw;
  }
  if (lists) cuda_check(cudaFreeAsync(lists, nullptr), kWho, "cudaFreeAsync");
  return pairs;
}

}  // namespace kvbench
