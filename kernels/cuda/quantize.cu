#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quantize.h"

namespace kvbench {
namespace {

constexpr int kThreads = 128;  // one thread per group

void check(cudaError_t err, const char* what) { cuda::check(err, "quantize_groups_cuda", what); }

void check_groups(const QuantGroups& q, const char* who) {
  if ((q.bits != 2 && q.bits != 4) || q.group_size <= 0 || (q.group_size * q.bits) % 8 != 0) {
    throw std::invalid_argument(std::string(who) +
                                ": bits must be 2 or 4 and group_size * bits a multiple of 8, got "
                                "bits " +
                                std::to_string(q.bits) + ", group_size " +
                                std::to_string(q.group_size));
  }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// One thread per group. The comparisons are std::min / std::max's (the first of equal values
// stays, so -0 and +0 come out as on the CPU) and the code is quantize.cpp's code_of.
__global__ void quantize_kernel(const float* x, int64_t group_stride, int64_t element_stride,
                                QuantGroups q, int64_t bytes) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= q.n_groups) return;
  const float* src = x + g * group_stride;
  float lo = src[0], hi = src[0];
  for (int32_t i = 1; i < q.group_size; ++i) {
    const float v = src[i * element_stride];
    lo = v < lo ? v : lo;
    hi = hi < v ? v : hi;
  }
  const uint32_t levels = (1u << q.bits) - 1;
  const float top = static_cast<float>(levels);
  const float scale = __fdiv_rn(hi - lo, top);
  const float inv = scale > 0 ? __fdiv_rn(1.0f, scale) : 0.0f;
  q.scale[g] = scale;
  q.min[g] = lo;
  const int32_t per_byte = 8 / q.bits;
  uint8_t* out = q.packed + g * bytes;
  for (int64_t b = 0; b < bytes; ++b) {
    uint32_t byte = 0;
    for (int32_t k = 0; k < per_byte; ++k) {
      const int64_t i = b * per_byte + k;
      // (x - min) * inv rounded twice, as on the CPU: __fmul_rn keeps it out of any fma.
      const float c = rintf(__fmul_rn(__fsub_rn(src[i * element_stride], lo), inv));
      const float clamped = c < 0.0f ? 0.0f : (top < c ? top : c);
      byte |= static_cast<uint32_t>(clamped) << (k * q.bits);
    }
    out[b] = static_cast<uint8_t>(byte);
  }
}

// One thread per (group, byte): writes that byte's 8 / bits values.
// (QuantGroups::group_bytes() is host-only: `bytes` is passed in.)
__global__ void dequantize_kernel(QuantGroups q, int64_t bytes, float* x, int64_t group_stride,
                                  int64_t element_stride) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= q.n_groups * bytes) return;
  const int64_t g = idx / bytes, b = idx % bytes;
  const int32_t per_byte = 8 / q.bits;
  const uint32_t mask = (1u << q.bits) - 1;
  const uint32_t byte = q.packed[idx];
  const float scale = q.scale[g], lo = q.min[g];
  float* dst = x + g * group_stride;
  for (int32_t k = 0; k < per_byte; ++k) {
    const float code = static_cast<float>((byte >> (k * q.bits)) & mask);
    dst[(b * per_byte + k) * element_stride] = __fmaf_rn(code, scale, lo);  // as the CPU: one fma
  }
}

}  // namespace

void quantize_groups_cuda(const float* x, int64_t group_stride, int64_t element_stride,
                          const QuantGroups& q, cudaStream_t stream) {
  check_groups(q, "quantize_groups_cuda");
  if (q.n_groups <= 0) return;
  quantize_kernel<<<blocks_for(q.n_groups), kThreads, 0, stream>>>(x, group_stride, element_stride,
                                                                   q, q.group_bytes());
  check(cudaGetLastError(), "quantize kernel launch");
}

void dequantize_groups_cuda(const QuantGroups& q, float* x, int64_t group_stride,
                            int64_t element_stride, cudaStream_t stream) {
  check_groups(q, "dequantize_groups_cuda");
  if (q.n_groups <= 0) return;
  dequantize_kernel<<<blocks_for(q.n_groups * q.group_bytes()), kThreads, 0, stream>>>(
      q, q.group_bytes(), x, group_stride, element_stride);
  check(cudaGetLastError(), "dequantize kernel launch");
}

}  // namespace kvbench
