#include "kernels/emulated/device_memory.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

namespace kvbench::emulated {

namespace {

// Start address -> size of every live allocation; a mutex because tests and stores may
// allocate from OpenMP threads.
struct Table {
  std::mutex mutex;
  std::map<uintptr_t, size_t> live;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: frees may run from static destructors
  return *t;
}

// The allocation holding address a, or live.end(). Caller holds the mutex.
std::map<uintptr_t, size_t>::const_iterator holding(const Table& t, uintptr_t a) {
  auto it = t.live.upper_bound(a);
  if (it == t.live.begin()) return t.live.end();
  --it;
  return a < it->first + it->second ? it : t.live.end();
}

}  // namespace

void* allocate_device(size_t bytes) {
  void* p = nullptr;
  // cudaMalloc's alignment; the kernels take float4 paths on 16-byte aligned pointers.
  if (posix_memalign(&p, 256, bytes) != 0) return nullptr;
  std::memset(p, kPoisonByte, bytes);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.live[reinterpret_cast<uintptr_t>(p)] = bytes;
  return p;
}

bool free_device(void* p) {
  Table& t = table();
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.live.erase(reinterpret_cast<uintptr_t>(p)) == 0) return false;
  }
  std::free(p);
  return true;
}

bool inside_device(const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const auto it = holding(t, a);
  return it != t.live.end() && bytes <= it->first + it->second - a;
}

bool touches_device(const void* p, size_t bytes) {
  if (bytes == 0) return false;
  const auto a = reinterpret_cast<uintptr_t>(p);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (holding(t, a) != t.live.end()) return true;
  // An allocation starting inside (a, a + bytes) is touched too.
  const auto next = t.live.upper_bound(a);
  return next != t.live.end() && next->first - a < bytes;
}

void fail(const char* who, const char* message) {
  std::fprintf(stderr, "cuda emulation: %s: %s\n", who, message);
  std::fflush(stderr);
  std::abort();
}

void require_device(const void* p, int64_t bytes, const char* who, const char* what) {
  if (bytes <= 0 || inside_device(p, static_cast<size_t>(bytes))) return;
  char line[256];
  std::snprintf(line, sizeof line,
                "%s = %p: %" PRId64 " bytes are not inside one live device allocation", what, p,
                bytes);
  fail(who, line);
}

}  // namespace kvbench::emulated
