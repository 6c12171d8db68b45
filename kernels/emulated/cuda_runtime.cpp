// The CUDA runtime calls kvbench makes, on the host: one device (cudaGetDeviceCount is 1), memory
// from device_memory.h, synchronous copies that check their direction and bounds, streams and
// events as tokens (the emulated kernels run when they are called, so every stream is in order).
// Declarations are the real <cuda_runtime_api.h>'s; nothing here links libcudart.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "kernels/emulated/device_memory.h"

// Opaque in the CUDA headers; the emulation's own.
struct CUstream_st {
  int unused = 0;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point at;
  bool recorded = false;
};

namespace {

using kvbench::emulated::fail;
using kvbench::emulated::inside_device;
using kvbench::emulated::touches_device;

const char* kind_name(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost: return "HostToHost";
    case cudaMemcpyHostToDevice: return "HostToDevice";
    case cudaMemcpyDeviceToHost: return "DeviceToHost";
    case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
    case cudaMemcpyDefault: return "Default";
  }
  return "an unknown kind";
}

// Where one side of a copy must be: wholly inside one allocation, or wholly outside all.
bool side_ok(const void* p, size_t extent, bool on_device) {
  return on_device ? inside_device(p, extent) : !touches_device(p, extent);
}

// Aborts unless both extents sit where `kind` says. cudaMemcpyDefault (unified addressing) is
// refused: kvbench always names the direction, and a wrong guess is what this catches.
void check_copy(const char* call, void* dst, size_t dst_extent, const void* src,
                size_t src_extent, cudaMemcpyKind kind) {
  if (dst_extent == 0 && src_extent == 0) return;
  bool ok = false;
  const char* why = "";
  switch (kind) {
    case cudaMemcpyHostToDevice:
    case cudaMemcpyDeviceToHost:
    case cudaMemcpyDeviceToDevice:
    case cudaMemcpyHostToHost: {
      const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
      const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
      const bool dst_ok = side_ok(dst, dst_extent, dst_device);
      const bool src_ok = side_ok(src, src_extent, src_device);
      ok = dst_ok && src_ok;
      why = !dst_ok ? (dst_device ? "destination not inside one live device allocation"
                                  : "destination is device memory")
                    : (src_device ? "source not inside one live device allocation"
                                  : "source is device memory");
      break;
    }
    default:
      why = "only explicit directions are emulated";
  }
  if (ok) return;
  char line[320];
  std::snprintf(line, sizeof line, "dst %p (%zu bytes), src %p (%zu bytes), %s: %s", dst,
                dst_extent, src, src_extent, kind_name(kind), why);
  fail(call, line);
}

// Bytes a pitched copy spans: height rows of width bytes, pitch apart.
size_t pitched_extent(size_t pitch, size_t width, size_t height) {
  return height == 0 || width == 0 ? 0 : (height - 1) * pitch + width;
}

cudaError_t copy_2d(const char* call, void* dst, size_t dpitch, const void* src, size_t spitch,
                    size_t width, size_t height, cudaMemcpyKind kind) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  check_copy(call, dst, pitched_extent(dpitch, width, height), src,
             pitched_extent(spitch, width, height), kind);
  for (size_t r = 0; r < height && width > 0; ++r) {
    // memcpy, not memmove: overlapping copies are undefined on a GPU, and ASan reports them.
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                width);
  }
  return cudaSuccess;
}

struct Handles {
  std::mutex mutex;
  std::set<const void*> streams, events;
};

Handles& handles() {
  static Handles* h = new Handles;
  return *h;
}

// The default stream (nullptr, or the legacy and per-thread handles) or a live created one.
void check_stream(cudaStream_t stream, const char* call) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return;
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  if (!h.streams.count(stream)) fail(call, "not a live stream");
}

CUevent_st* live_event(cudaEvent_t event, const char* call) {
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  if (!h.events.count(event)) fail(call, "not a live event");
  return event;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "kvbench CUDA emulation (host)");
  prop->totalGlobalMem = size_t{80} << 30;
  prop->multiProcessorCount = 132;  // an H100's: split-K decisions are made as on one
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 132; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    default: return cudaErrorInvalidValue;  // what a caller must handle for any attribute
  }
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

// Kernels that fail abort or throw at once, so no error is ever pending.
cudaError_t cudaGetLastError(void) { return cudaSuccess; }

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    default: return "unrecognized error code (CUDA emulation)";
  }
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  *ptr = kvbench::emulated::allocate_device(size);
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  check_stream(stream, "cudaMallocAsync");
  return cudaMalloc(ptr, size);
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  if (!kvbench::emulated::free_device(ptr)) {
    char line[160];
    std::snprintf(line, sizeof line, "%p is not a live device allocation (double free?)", ptr);
    fail("cudaFree", line);
  }
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  check_stream(stream, "cudaFreeAsync");
  if (ptr != nullptr && !kvbench::emulated::free_device(ptr)) {
    char line[160];
    std::snprintf(line, sizeof line, "%p is not a live device allocation (double free?)", ptr);
    fail("cudaFreeAsync", line);
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return copy_2d("cudaMemcpy", dst, count, src, count, count, 1, kind);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  check_stream(stream, "cudaMemcpyAsync");
  return copy_2d("cudaMemcpyAsync", dst, count, src, count, count, 1, kind);
}

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height, cudaMemcpyKind kind) {
  return copy_2d("cudaMemcpy2D", dst, dpitch, src, spitch, width, height, kind);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  check_stream(stream, "cudaMemcpy2DAsync");
  return copy_2d("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind);
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  kvbench::emulated::require_device(ptr, static_cast<int64_t>(count), "cudaMemset", "devPtr");
  if (count > 0) std::memset(ptr, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  check_stream(stream, "cudaMemsetAsync");
  kvbench::emulated::require_device(ptr, static_cast<int64_t>(count), "cudaMemsetAsync",
                                    "devPtr");
  if (count > 0) std::memset(ptr, value, count);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st;
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  check_stream(stream, "cudaStreamDestroy");
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return cudaErrorInvalidResourceHandle;
  }
  {
    Handles& h = handles();
    std::lock_guard<std::mutex> lock(h.mutex);
    h.streams.erase(stream);
  }
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  check_stream(stream, "cudaStreamSynchronize");
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  live_event(event, "cudaEventDestroy");
  {
    Handles& h = handles();
    std::lock_guard<std::mutex> lock(h.mutex);
    h.events.erase(event);
  }
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  check_stream(stream, "cudaEventRecord");
  CUevent_st* e = live_event(event, "cudaEventRecord");
  e->at = std::chrono::steady_clock::now();  // the work before it has run already
  e->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  live_event(event, "cudaEventSynchronize");
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const CUevent_st* a = live_event(start, "cudaEventElapsedTime");
  const CUevent_st* b = live_event(end, "cudaEventElapsedTime");
  if (!a->recorded || !b->recorded) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}

}  // extern "C"
