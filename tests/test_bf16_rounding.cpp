// The CPU reference of bf16 rounding (kernels/cpu/layer_ops.h), which the CUDA conversion
// kernels and the model's bf16 mode are tested against: round to nearest, ties to even, on
// hand-picked bit patterns (ties both ways, carries into the exponent, overflow to infinity,
// subnormals), NaN kept, and exactness of the way back.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/layer_ops.h"

namespace {

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

using kvbench::bf16_bits_to_float;
using kvbench::float_to_bf16_bits;

}  // namespace

TEST_CASE("float_to_bf16_bits rounds to nearest, ties to even", "[unit]") {
  // Exact values keep their upper half.
  CHECK(float_to_bf16_bits(1.0f) == 0x3F80);
  CHECK(float_to_bf16_bits(-3.0f) == 0xC040);
  CHECK(float_to_bf16_bits(0.0f) == 0x0000);
  CHECK(float_to_bf16_bits(-0.0f) == 0x8000);
  // Below half an ulp: down; above: up.
  CHECK(float_to_bf16_bits(from_bits(0x3F807FFF)) == 0x3F80);
  CHECK(float_to_bf16_bits(from_bits(0x3F808001)) == 0x3F81);
  // Exactly half: to the even neighbour, down from an even lsb, up from an odd one.
  CHECK(float_to_bf16_bits(from_bits(0x3F808000)) == 0x3F80);
  CHECK(float_to_bf16_bits(from_bits(0x3F818000)) == 0x3F82);
  CHECK(float_to_bf16_bits(from_bits(0xBF818000)) == 0xBF82);  // sign does not matter
  // A carry through the mantissa into the exponent: 1.99999 rounds to 2.
  CHECK(float_to_bf16_bits(from_bits(0x3FFFFFFF)) == 0x4000);
  // Past bf16's largest finite value (0x7F7F): infinity, as IEEE rounding says.
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(float_to_bf16_bits(from_bits(0x7F7F7FFF)) == 0x7F7F);
  CHECK(float_to_bf16_bits(-std::numeric_limits<float>::infinity()) == 0xFF80);
  // Subnormals round like any other value (no flush to zero).
  CHECK(float_to_bf16_bits(from_bits(0x00018000)) == 0x0002);
  CHECK(float_to_bf16_bits(from_bits(0x00008000)) == 0x0000);
  CHECK(float_to_bf16_bits(from_bits(0x0000C000)) == 0x0001);
}

TEST_CASE("float_to_bf16_bits keeps a NaN a NaN", "[unit]") {
  // Payloads only in the low half would round to infinity (0x7F80) without the NaN rule.
  for (const uint32_t nan : {0x7F800001u, 0x7F80FFFFu, 0xFF800001u, 0x7FC00000u, 0x7FFFFFFFu}) {
    INFO(std::hex << nan);
    const uint16_t h = float_to_bf16_bits(from_bits(nan));
    CHECK(std::isnan(bf16_bits_to_float(h)));
    CHECK((h & 0x8000) == ((nan >> 16) & 0x8000));  // the sign is kept
  }
}

TEST_CASE("bf16 round trips and rounding in place agree with the bits", "[unit]") {
  // Every bf16 value converts back to itself exactly.
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float x = bf16_bits_to_float(static_cast<uint16_t>(h));
    if (std::isnan(x)) continue;
    REQUIRE(float_to_bf16_bits(x) == h);
  }
  // round_to_bf16_cpu is the conversion there and back; its error is at most half a bf16
  // ulp, at most 2^-8 relative to the value (bf16 keeps 8 significant bits).
  std::vector<float> x;
  for (int i = 0; i < 4096; ++i) x.push_back(std::ldexp(std::sin(i * 0.37f) * 1.7f, i % 40 - 20));
  std::vector<float> rounded = x;
  kvbench::round_to_bf16_cpu(rounded.data(), static_cast<int64_t>(rounded.size()));
  std::vector<uint16_t> bits(x.size());
  kvbench::fp32_to_bf16_cpu(x.data(), bits.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    REQUIRE(rounded[i] == bf16_bits_to_float(bits[i]));
    REQUIRE(std::fabs(rounded[i] - x[i]) <= std::fabs(x[i]) * std::ldexp(1.0f, -8));
  }
}
