// An array in device memory that frees itself: what the device-side stores, the model's
// device weights and the benchmarks hold. Host code only; pulls in <cuda_runtime.h>.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvbench {

// Throws std::runtime_error "<who>: <what>: <CUDA's message>" when err is not cudaSuccess.
inline void cuda_check(cudaError_t err, const char* who, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(who) + ": " + what + ": " + cudaGetErrorString(err));
  }
}

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // n elements, uninitialised.
  explicit DeviceBuffer(int64_t n) : size_(n) {
    if (n > 0) {
      cuda_check(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()), "DeviceBuffer",
                 ("cudaMalloc of " + std::to_string(bytes()) + " bytes").c_str());
    }
  }
  // A device copy of n host elements.
  DeviceBuffer(const T* host, int64_t n) : DeviceBuffer(n) { upload(host, n); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer(std::move(other)).swap(*this);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }

  T* data() const { return data_; }
  int64_t size() const { return size_; }
  int64_t bytes() const { return size_ * static_cast<int64_t>(sizeof(T)); }

  // Copies n host elements to elements [offset, offset + n); synchronous.
  void upload(const T* host, int64_t n, int64_t offset = 0) {
    if (n > 0) {
      cuda_check(cudaMemcpy(data_ + offset, host, n * sizeof(T), cudaMemcpyHostToDevice),
                 "DeviceBuffer", "upload");
    }
  }
  // Copies elements [offset, offset + n) to the host after the work before it finished.
  void download(T* host, int64_t n, int64_t offset = 0) const {
    if (n > 0) {
      cuda_check(cudaMemcpy(host, data_ + offset, n * sizeof(T), cudaMemcpyDeviceToHost),
                 "DeviceBuffer", "download");
    }
  }

  void swap(DeviceBuffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }

 private:
  T* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace kvbench
