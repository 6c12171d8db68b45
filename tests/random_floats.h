// Seeded normal(0, 1) floats for kernel and cache tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvbench::testing {

inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

}  // namespace kvbench::testing
