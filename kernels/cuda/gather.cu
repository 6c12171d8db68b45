#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gather.h"

namespace kvbench {
namespace {

constexpr int kWarps = 8;  // output rows per block, a warp each

void check(cudaError_t err, const char* what) { cuda::check(err, "gather_rows_cuda", what); }

// Block (rows kWarps x .. + kWarps, KV head y); a warp per output row, lanes over the row's
// elements of type T (float4 where rows and pointers allow, else float). A slot out of range
// leaves its row unwritten.
template <class T>
__global__ void __launch_bounds__(kWarps * 32)
    gather_kernel(const T* k, const T* v, const int32_t* positions, int64_t capacity,
                  int64_t n_tokens, const int32_t* slots, int64_t n_keep, T* out_k, T* out_v,
                  int32_t* out_positions, int64_t out_capacity, int row_elems) {
  const int64_t h = blockIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (j >= n_keep) return;
  const int32_t s = slots[h * n_keep + j];
  if (s < 0 || s >= n_tokens) return;
  const int64_t from = h * capacity + s;
  const int64_t to = h * out_capacity + j;
  const T* k_row = k + from * row_elems;
  const T* v_row = v + from * row_elems;
  T* k_dst = out_k + to * row_elems;
  T* v_dst = out_v + to * row_elems;
  for (int e = lane; e < row_elems; e += 32) {
    k_dst[e] = k_row[e];
    v_dst[e] = v_row[e];
  }
  if (lane == 0) out_positions[to] = positions[from];
}

// Block (moves kWarps x .. + kWarps); a warp per move, lanes over the row's elements of type T.
// Sources and destinations are disjoint (the caller's contract), so the order is free. A move
// with a row out of range is skipped.
template <class T>
__global__ void __launch_bounds__(kWarps * 32)
    move_kernel(T* k, T* v, int32_t* positions, int64_t n_rows, const int64_t* from,
                const int64_t* to, int64_t n_moves, int row_elems) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= n_moves) return;
  const int64_t src = from[i], dst = to[i];
  if (src < 0 || src >= n_rows || dst < 0 || dst >= n_rows) return;
  for (int e = lane; e < row_elems; e += 32) {
    k[dst * row_elems + e] = k[src * row_elems + e];
    v[dst * row_elems + e] = v[src * row_elems + e];
  }
  if (lane == 0) positions[dst] = positions[src];
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

DenseKv gather_rows_cuda(const DenseKv& kv, const int32_t* slots, int64_t n_keep,
                         const GatherTarget& out, cudaStream_t stream) {
  if (n_keep < 0 || out.capacity < n_keep) {
    throw std::invalid_argument("gather_rows_cuda: n_keep (" + std::to_string(n_keep) +
                                ") must be in [0, out.capacity = " +
                                std::to_string(out.capacity) + "]");
  }
  if (kv.n_kv_heads > 65535) {
    throw std::invalid_argument("gather_rows_cuda: more than 65535 KV heads");
  }
  const DenseKv view{out.k, out.v, out.positions, kv.n_kv_heads, kv.head_dim, out.capacity, n_keep};
  if (n_keep == 0 || kv.n_kv_heads <= 0 || kv.head_dim <= 0) return view;
  const dim3 grid(static_cast<unsigned>((n_keep + kWarps - 1) / kWarps),
                  static_cast<unsigned>(kv.n_kv_heads));
  // Rows of a multiple of 4 floats from 16-byte aligned bases start 16-byte aligned: float4.
  if (kv.head_dim % 4 == 0 && aligned16(kv.k) && aligned16(kv.v) && aligned16(out.k) &&
      aligned16(out.v)) {
    gather_kernel<float4><<<grid, kWarps * 32, 0, stream>>>(
        reinterpret_cast<const float4*>(kv.k), reinterpret_cast<const float4*>(kv.v),
        kv.positions, kv.capacity, kv.n_tokens, slots, n_keep, reinterpret_cast<float4*>(out.k),
        reinterpret_cast<float4*>(out.v), out.positions, out.capacity, kv.head_dim / 4);
  } else {
    gather_kernel<float><<<grid, kWarps * 32, 0, stream>>>(
        kv.k, kv.v, kv.positions, kv.capacity, kv.n_tokens, slots, n_keep, out.k, out.v,
        out.positions, out.capacity, kv.head_dim);
  }
  check(cudaGetLastError(), "kernel launch");
  return view;
}

void move_rows_cuda(const GatherTarget& rows, int32_t n_kv_heads, int32_t head_dim,
                    const int64_t* from, const int64_t* to, int64_t n_moves, cudaStream_t stream) {
  if (n_moves < 0) {
    throw std::invalid_argument("move_rows_cuda: n_moves (" + std::to_string(n_moves) +
                                ") must be >= 0");
  }
  if (n_moves == 0 || n_kv_heads <= 0 || head_dim <= 0) return;
  const int64_t n_blocks = (n_moves + kWarps - 1) / kWarps;
  if (n_blocks > 2147483647) throw std::invalid_argument("move_rows_cuda: too many moves");
  const int64_t n_rows = static_cast<int64_t>(n_kv_heads) * rows.capacity;
  const unsigned grid = static_cast<unsigned>(n_blocks);
  if (head_dim % 4 == 0 && aligned16(rows.k) && aligned16(rows.v)) {
    move_kernel<float4><<<grid, kWarps * 32, 0, stream>>>(
        reinterpret_cast<float4*>(rows.k), reinterpret_cast<float4*>(rows.v), rows.positions,
        n_rows, from, to, n_moves, head_dim / 4);
  } else {
    move_kernel<float><<<grid, kWarps * 32, 0, stream>>>(rows.k, rows.v, rows.positions, n_rows,
                                                         from, to, n_moves, head_dim);
  }
  cuda::check(cudaGetLastError(), "move_rows_cuda", "kernel launch");
}

}  // namespace kvbench
