// CUDA twin of kernels/cpu/quantize.h: KIVI's 2/4-bit group quantization over QuantGroups
// (kernels/layouts.h), device pointers. Include only from CUDA-aware code: this header pulls in
// <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// As quantize_groups_cpu: group g's element i is x[g * group_stride + i * element_stride]; fills
// q.packed, q.scale and q.min, bit-identical to the CPU (same min/max, IEEE division, rintf is
// nearbyint's round-half-even). Enqueued on `stream` (asynchronous). Throws
// std::invalid_argument for bits other than 2 or 4 or group_size * bits not a multiple of 8,
// std::runtime_error on a CUDA error.
void quantize_groups_cuda(const float* x, int64_t group_stride, int64_t element_stride,
                          const QuantGroups& q, cudaStream_t stream);

// As dequantize_groups_cpu: x = min + code * scale, the product rounded before the add (no fma).
void dequantize_groups_cuda(const QuantGroups& q, float* x, int64_t group_stride,
                            int64_t element_stride, cudaStream_t stream);

}  // namespace kvbench
