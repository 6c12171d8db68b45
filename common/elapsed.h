// Wall time since a steady_clock reading: what TTFT, load and store timings are measured with.
#pragma once

#include <chrono>

namespace kvbench {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

inline double ms_since(std::chrono::steady_clock::time_point start) {
  return seconds_since(start) * 1e3;
}

}  // namespace kvbench
