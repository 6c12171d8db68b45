// KIVI's group quantization on the CPU: quantize, pack and unpack groups of floats to 2 or
// 4 bits (kernels/layouts.h, QuantGroups), with plain references beside the kernels.
// Group g's element i is x[g * group_stride + i * element_stride]: keys per channel over
// a block of T tokens of a [T, head_dim] slab are group_stride 1, element_stride head_dim;
// values per token are group_stride group_size, element_stride 1.
#pragma once

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

// Fills q.packed, q.scale and q.min for q.n_groups groups read from x. A constant group
// gets scale 0 and codes 0 (exact on the way back).
void quantize_groups_cpu(const float* x, int64_t group_stride, int64_t element_stride,
                         const QuantGroups& q);
void dequantize_groups_cpu(const QuantGroups& q, float* x, int64_t group_stride,
                           int64_t element_stride);

// One value at a time, no packing tricks: what the kernels are tested against.
void quantize_groups_reference(const float* x, int64_t group_stride, int64_t element_stride,
                               const QuantGroups& q);
void dequantize_groups_reference(const QuantGroups& q, float* x, int64_t group_stride,
                                 int64_t element_stride);

}  // namespace kvbench
