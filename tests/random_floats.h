// Seeded normal(0, 1) floats for kernel and cache tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace kvbench::testing {

// One normal(0, 1) draw by Box-Muller on two 24-bit uniforms. Not std::normal_distribution:
// libstdc++'s generate_canonical computes two long-double logarithms per draw, which unoptimised
// sanitizer builds do not fold, and test data generation was half of the kernel tests' time.
inline float standard_normal(std::mt19937& rng) {
  constexpr float kTwoPi = 6.28318530717958647692f;
  const float u1 = (static_cast<float>(rng() >> 8) + 0.5f) * 0x1p-24f;  // (0, 1)
  const float u2 = static_cast<float>(rng() >> 8) * 0x1p-24f;            // [0, 1)
  return std::sqrt(-2.f * std::log(u1)) * std::cos(kTwoPi * u2);
}

// Uniform floats in [lo, hi) from 24-bit draws, used as std::uniform_real_distribution<float>
// is (for the same reason as standard_normal).
struct UniformFloat {
  float lo, hi;
  float operator()(std::mt19937& rng) const {
    return lo + (hi - lo) * (static_cast<float>(rng() >> 8) * 0x1p-24f);
  }
};

inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> out(n);
  for (float& x : out) x = standard_normal(rng);
  return out;
}

}  // namespace kvbench::testing
