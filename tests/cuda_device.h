// What the CUDA tests share: skipping without a device (exit 77, ctest SKIP) and device
// copies of host vectors.
#pragma once

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace kvbench::testing {

inline void require_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    std::fflush(stdout);
    std::exit(77);
  }
}

// n elements at a device pointer, copied to the host after the device has finished.
template <typename T>
std::vector<T> download(const T* device, int64_t n) {
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<T> host(static_cast<size_t>(n));
  if (n > 0) {
    REQUIRE(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  }
  return host;
}

// A device copy of a host vector (one spare byte so an empty one still allocates), freed with it.
template <typename T>
class Device {
 public:
  explicit Device(const std::vector<T>& host) : n_(host.size()) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&ptr_), n_ * sizeof(T) + 1) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() { cudaFree(ptr_); }
  T* get() const { return ptr_; }
  // Waits for the default stream, then copies back.
  std::vector<T> host() const {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<T> out(n_);
    REQUIRE(cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return out;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

}  // namespace kvbench::testing
