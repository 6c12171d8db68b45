#include "cache/cuda/row_memory.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace kvbench {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("device_memory: ") + what + ": " +
                             cudaGetErrorString(status));
  }
}

class DeviceMemory : public RowMemory {
 public:
  std::shared_ptr<float> floats(int64_t n) const override {
    void* p = nullptr;
    check(cudaMallocAsync(&p, static_cast<size_t>(n) * sizeof(float), nullptr), "allocate");
    // Freed in stream order: the kernels that read it were enqueued before the last handle
    // goes.
    return std::shared_ptr<float>(static_cast<float*>(p),
                                  [](float* q) { cudaFreeAsync(q, nullptr); });
  }
  void copy_rows(float* to, int64_t to_stride, const float* from, int64_t from_stride,
                 int64_t width, int64_t n_rows) const override {
    if (n_rows <= 0 || width <= 0) return;
    check(cudaMemcpy2DAsync(to, to_stride * sizeof(float), from, from_stride * sizeof(float),
                            width * sizeof(float), n_rows, cudaMemcpyDeviceToDevice, nullptr),
          "copy rows");
  }
};

}  // namespace

const std::shared_ptr<const RowMemory>& device_memory() {
  static const std::shared_ptr<const RowMemory> memory = std::make_shared<DeviceMemory>();
  return memory;
}

}  // namespace kvbench
