// The emulation's device memory (kernels/emulated/README in docs/gpu.md): host allocations that
// cudaMalloc hands out, filled with a poison byte and kept in a table of live allocations, so
// that copies and emulated kernels can check that a "device" pointer really is one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvbench::emulated {

// Every byte of a new allocation: 0xFF makes a float read before it is written a NaN.
constexpr unsigned char kPoisonByte = 0xFF;

// Registers a new allocation of `bytes` (> 0), poisoned; nullptr when the host is out of memory.
void* allocate_device(size_t bytes);
// Unregisters and frees it; false when p is not the start of a live allocation (a double free,
// a host pointer, an interior pointer).
bool free_device(void* p);

// Whether [p, p + bytes) lies wholly inside one live allocation (bytes > 0).
bool inside_device(const void* p, size_t bytes);
// Whether any byte of [p, p + bytes) belongs to a live allocation.
bool touches_device(const void* p, size_t bytes);

// Prints "cuda emulation: <who>: <message>" as one line on stderr and aborts: what a GPU would
// have done with the same mistake is undefined, so the emulation stops at the first one.
[[noreturn]] void fail(const char* who, const char* message);

// Aborts, naming `who` and the argument `what`, unless [p, p + bytes) lies inside one live
// device allocation. Nothing is checked for bytes <= 0 (an empty extent reads nothing).
void require_device(const void* p, int64_t bytes, const char* who, const char* what);

// As require_device for `count` elements of T.
template <class T>
void require_device_array(const T* p, int64_t count, const char* who, const char* what) {
  require_device(p, count * static_cast<int64_t>(sizeof(T)), who, what);
}

}  // namespace kvbench::emulated
