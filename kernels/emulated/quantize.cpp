// KIVI's group quantization (kernels/cuda/quantize.h) on the host: the wrapper's checks,
// pointers checked against the live allocations, then kernels/cpu/quantize.h. Synchronous.
#include "kernels/cuda/quantize.h"

#include <stdexcept>
#include <string>

#include "kernels/cpu/quantize.h"
#include "kernels/emulated/device_memory.h"

namespace kvbench {

namespace {

void check_groups(const QuantGroups& q, const char* who) {
  if ((q.bits != 2 && q.bits != 4) || q.group_size <= 0 || (q.group_size * q.bits) % 8 != 0) {
    throw std::invalid_argument(std::string(who) +
                                ": bits must be 2 or 4 and group_size * bits a multiple of 8, got "
                                "bits " +
                                std::to_string(q.bits) + ", group_size " +
                                std::to_string(q.group_size));
  }
}

// The groups' storage, and the floats they are read from or written to: the last group's last
// element is the farthest (strides are non-negative in every caller).
void require_groups(const QuantGroups& q, const float* x, int64_t group_stride,
                    int64_t element_stride, const char* who) {
  emulated::require_device_array(q.packed, q.n_groups * q.group_bytes(), who, "q.packed");
  emulated::require_device_array(q.scale, q.n_groups, who, "q.scale");
  emulated::require_device_array(q.min, q.n_groups, who, "q.min");
  const int64_t floats = (q.n_groups - 1) * group_stride + (q.group_size - 1) * element_stride + 1;
  emulated::require_device_array(x, floats, who, "x");
}

}  // namespace

void quantize_groups_cuda(const float* x, int64_t group_stride, int64_t element_stride,
                          const QuantGroups& q, cudaStream_t) {
  check_groups(q, "quantize_groups_cuda");
  if (q.n_groups <= 0) return;
  require_groups(q, x, group_stride, element_stride, "quantize_groups_cuda");
  quantize_groups_cpu(x, group_stride, element_stride, q);
}

void dequantize_groups_cuda(const QuantGroups& q, float* x, int64_t group_stride,
                            int64_t element_stride, cudaStream_t) {
  check_groups(q, "dequantize_groups_cuda");
  if (q.n_groups <= 0) return;
  require_groups(q, x, group_stride, element_stride, "dequantize_groups_cuda");
  dequantize_groups_cpu(q, x, group_stride, element_stride);
}

}  // namespace kvbench
