#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/narrow.h"
#include "kernels/cuda/narrow_element.h"

namespace kvbench {
namespace {

using cuda::check;
using cuda::warp_max;

constexpr int kWarps = 8;     // rows per block, a warp each
constexpr int kThreads = 256;  // elementwise kernels

// How one element type is stored and rounded (fp8's row scale is encode_row's).
template <KvElement E>
struct Element;
template <>
struct Element<KvElement::F16> {
  using Bits = uint16_t;
  static __device__ Bits round(float x) { return narrow::half_bits(x); }
  static __device__ float widen(Bits b) { return narrow::half_value(b); }
};
template <>
struct Element<KvElement::BF16> {
  using Bits = uint16_t;
  static __device__ Bits round(float x) { return narrow::bf16_bits(x); }
  static __device__ float widen(Bits b) { return narrow::bf16_value(b); }
};
template <>
struct Element<KvElement::F8E4M3> {
  using Bits = uint8_t;
  static __device__ Bits round(float x) { return narrow::e4m3_bits(x); }
  static __device__ float widen(Bits b) { return narrow::e4m3_value(b); }
};

// One row rounded by a whole warp (lanes over its elements): fp8 first finds the row's
// largest magnitude (fmaxf ignores a NaN, as the CPU's std::max does) and writes its scale.
template <KvElement E>
__device__ void encode_row(const float* x, int dim, typename Element<E>::Bits* out, float* scale,
                           int lane) {
  if constexpr (E == KvElement::F8E4M3) {
    float amax = 0.0f;
    for (int d = lane; d < dim; d += 32) amax = fmaxf(amax, fabsf(x[d]));
    const float s = narrow::e4m3_scale(warp_max(amax));
    if (lane == 0) *scale = s;
    for (int d = lane; d < dim; d += 32) out[d] = Element<E>::round(x[d] / s);
  } else {
    for (int d = lane; d < dim; d += 32) out[d] = Element<E>::round(x[d]);
  }
}

template <KvElement E>
__global__ void __launch_bounds__(kWarps * 32)
    encode_kernel(const float* src, int64_t src_stride, int64_t n_rows, int dim, void* dst,
                  float* scale) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= n_rows) return;  // uniform across the warp
  auto* out = static_cast<typename Element<E>::Bits*>(dst) + r * dim;
  encode_row<E>(src + r * src_stride, dim, out, scale ? scale + r : nullptr, threadIdx.x % 32);
}

template <KvElement E>
__global__ void decode_kernel(const void* src, const float* scale, int64_t n, int dim,
                              float* dst) {
  const auto* in = static_cast<const typename Element<E>::Bits*>(src);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = Element<E>::widen(in[i]);
    dst[i] = E == KvElement::F8E4M3 ? x * scale[i / dim] : x;  // one rounding, as the CPU
  }
}

// A warp per (token t, head h) of the chunk: input row t * n_kv_heads + h goes to row
// h * capacity + n_tokens + t, keys and values, lane 0 writing the position.
template <KvElement E>
__global__ void __launch_bounds__(kWarps * 32)
    append_kernel(NarrowTarget rows, int64_t n_tokens, const float* k, const float* v,
                  const int32_t* positions, int64_t n_new) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= n_new * rows.n_kv_heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = r / rows.n_kv_heads, h = r % rows.n_kv_heads;
  const int64_t to = h * rows.capacity + n_tokens + t;
  const int dim = rows.head_dim;
  using Bits = typename Element<E>::Bits;
  float* k_scale = rows.k_scale ? rows.k_scale + to : nullptr;  // fp8's only
  float* v_scale = rows.v_scale ? rows.v_scale + to : nullptr;
  encode_row<E>(k + r * dim, dim, static_cast<Bits*>(rows.k) + to * dim, k_scale, lane);
  encode_row<E>(v + r * dim, dim, static_cast<Bits*>(rows.v) + to * dim, v_scale, lane);
  if (lane == 0) rows.positions[to] = positions[t];
}

// A warp per move, lanes over the row's words of type W (4 bytes where rows allow). A move
// with a row out of range is skipped.
template <class W>
__global__ void __launch_bounds__(kWarps * 32)
    move_kernel(NarrowTarget rows, const int64_t* from, const int64_t* to, int64_t n_moves,
                int row_words) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (i >= n_moves) return;
  const int lane = threadIdx.x % 32;
  const int64_t src = from[i], dst = to[i];
  const int64_t n_rows = static_cast<int64_t>(rows.n_kv_heads) * rows.capacity;
  if (src < 0 || src >= n_rows || dst < 0 || dst >= n_rows) return;
  W* k = static_cast<W*>(rows.k);
  W* v = static_cast<W*>(rows.v);
  for (int e = lane; e < row_words; e += 32) {
    k[dst * row_words + e] = k[src * row_words + e];
    v[dst * row_words + e] = v[src * row_words + e];
  }
  if (lane == 0) {
    rows.positions[dst] = rows.positions[src];
    if (rows.k_scale) {
      rows.k_scale[dst] = rows.k_scale[src];
      rows.v_scale[dst] = rows.v_scale[src];
    }
  }
}

unsigned row_blocks(int64_t n_rows, const char* who) {
  const int64_t blocks = (n_rows + kWarps - 1) / kWarps;
  if (blocks > INT32_MAX) throw std::invalid_argument(std::string(who) + ": too many rows");
  return static_cast<unsigned>(blocks);
}

// Runs f(Element tag) for the element's template instance.
template <class F>
void with_element(KvElement element, const F& f) {
  switch (element) {
    case KvElement::F16:
      f(std::integral_constant<KvElement, KvElement::F16>{});
      break;
    case KvElement::BF16:
      f(std::integral_constant<KvElement, KvElement::BF16>{});
      break;
    case KvElement::F8E4M3:
      f(std::integral_constant<KvElement, KvElement::F8E4M3>{});
      break;
  }
}

void check_rows(int64_t n_rows, int32_t dim, const char* who) {
  if (n_rows < 0 || dim <= 0) {
    throw std::invalid_argument(std::string(who) + ": n_rows must be >= 0 and dim > 0, got " +
                                std::to_string(n_rows) + ", " + std::to_string(dim));
  }
}

}  // namespace

void encode_kv_rows_cuda(KvElement element, const float* src, int64_t src_stride, int64_t n_rows,
                         int32_t dim, void* dst, float* scale, cudaStream_t stream) {
  const char* who = "encode_kv_rows_cuda";
  check_rows(n_rows, dim, who);
  if (n_rows == 0) return;
  const unsigned blocks = row_blocks(n_rows, who);
  with_element(element, [&](auto e) {
    encode_kernel<decltype(e)::value>
        <<<blocks, kWarps * 32, 0, stream>>>(src, src_stride, n_rows, dim, dst, scale);
  });
  check(cudaGetLastError(), who, "kernel launch");
}

void decode_kv_rows_cuda(KvElement element, const void* src, const float* scale, int64_t n_rows,
                         int32_t dim, float* dst, cudaStream_t stream) {
  const char* who = "decode_kv_rows_cuda";
  check_rows(n_rows, dim, who);
  const int64_t n = n_rows * dim;
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads,
                                                                   int64_t{1} << 20));
  with_element(element, [&](auto e) {
    decode_kernel<decltype(e)::value><<<blocks, kThreads, 0, stream>>>(src, scale, n, dim, dst);
  });
  check(cudaGetLastError(), who, "kernel launch");
}

void append_narrow_rows_cuda(const NarrowTarget& rows, int64_t n_tokens, const float* k,
                             const float* v, const int32_t* positions, int64_t n_new,
                             cudaStream_t stream) {
  const char* who = "append_narrow_rows_cuda";
  if (n_new < 0 || n_tokens < 0 || n_tokens + n_new > rows.capacity) {
    throw std::invalid_argument(std::string(who) + ": " + std::to_string(n_new) +
                                " rows after " + std::to_string(n_tokens) +
                                " do not fit a capacity of " + std::to_string(rows.capacity));
  }
  if (n_new == 0 || rows.n_kv_heads <= 0) return;
  check_rows(n_new, rows.head_dim, who);
  const unsigned blocks = row_blocks(n_new * rows.n_kv_heads, who);
  with_element(rows.element, [&](auto e) {
    append_kernel<decltype(e)::value>
        <<<blocks, kWarps * 32, 0, stream>>>(rows, n_tokens, k, v, positions, n_new);
  });
  check(cudaGetLastError(), who, "kernel launch");
}

void move_narrow_rows_cuda(const NarrowTarget& rows, const int64_t* from, const int64_t* to,
                           int64_t n_moves, cudaStream_t stream) {
  const char* who = "move_narrow_rows_cuda";
  if (n_moves < 0) throw std::invalid_argument(std::string(who) + ": n_moves < 0");
  if (n_moves == 0) return;
  const unsigned blocks = row_blocks(n_moves, who);
  const int64_t row_bytes = static_cast<int64_t>(rows.head_dim) * kv_element_bytes(rows.element);
  if (row_bytes % 4 == 0) {
    move_kernel<uint32_t><<<blocks, kWarps * 32, 0, stream>>>(rows, from, to, n_moves,
                                                              static_cast<int>(row_bytes / 4));
  } else {
    move_kernel<uint8_t><<<blocks, kWarps * 32, 0, stream>>>(rows, from, to, n_moves,
                                                             static_cast<int>(row_bytes));
  }
  check(cudaGetLastError(), who, "kernel launch");
}

}  // namespace kvbench
