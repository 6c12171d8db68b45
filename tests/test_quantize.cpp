// KIVI's group quantization kernels against their references, over odd group counts, both
// strides (keys per channel, values per token), 2 and 4 bits; round-trip error within half
// a quantization step; the packing layout on a hand-made group.
#include <catch2/catch.hpp>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/quantize.h"
#include "random_floats.h"

using namespace kvbench;

namespace {

struct Buffers {
  std::vector<uint8_t> packed;
  std::vector<float> scale, min;
  QuantGroups q{};
  Buffers(int64_t n_groups, int32_t group_size, int32_t bits)
      : packed(static_cast<size_t>(n_groups * group_size * bits / 8)),
        scale(static_cast<size_t>(n_groups)),
        min(static_cast<size_t>(n_groups)) {
    q = QuantGroups{packed.data(), scale.data(), min.data(), n_groups, group_size, bits};
  }
};

}  // namespace

TEST_CASE("quantize: the packing layout on a hand-made group", "[unit]") {
  const std::vector<float> x = {0.0f, 1.0f, 2.0f, 3.0f};
  Buffers b(1, 4, 2);
  quantize_groups_cpu(x.data(), 4, 1, b.q);
  CHECK(b.min[0] == 0.0f);
  CHECK(b.scale[0] == 1.0f);
  CHECK(b.packed[0] == 0xE4);  // codes 0, 1, 2, 3 from the low bits up
  Buffers four(1, 4, 4);
  quantize_groups_cpu(x.data(), 4, 1, four.q);
  CHECK(four.packed[0] == 0x50);  // codes 0 and 5 (scale 3 / 15)
  CHECK(four.packed[1] == 0xFA);  // codes 10 and 15
  std::vector<float> back(4);
  dequantize_groups_cpu(b.q, back.data(), 4, 1);
  CHECK(back == x);
  Buffers bad(1, 4, 3);
  CHECK_THROWS_AS(quantize_groups_cpu(x.data(), 4, 1, bad.q), std::invalid_argument);
}

TEST_CASE("quantize: kernels equal the references and round-trip within half a step", "[unit]") {
  for (int32_t bits : {2, 4}) {
    for (int32_t head_dim : {64, 128}) {
      for (int64_t blocks : {int64_t{1}, int64_t{15}, int64_t{17}, int64_t{129}}) {
        for (bool per_channel : {true, false}) {
          // Keys: blocks of 32 tokens x head_dim, one group per channel per block (group
          // elements head_dim apart). Values: one group per 32 channels of a token.
          const int32_t group = 32;
          const int64_t tokens = blocks * group;
          const auto x = testing::random_floats(static_cast<size_t>(tokens * head_dim),
                                       static_cast<uint32_t>(bits * 1000 + head_dim + blocks));
          const int64_t n_groups = tokens * head_dim / group;
          INFO("bits " << bits << " head_dim " << head_dim << " blocks " << blocks
                       << (per_channel ? " keys per channel" : " values per token"));
          Buffers kernel(n_groups, group, bits), reference(n_groups, group, bits);
          std::vector<float> out(x.size()), ref_out(x.size());
          // Group g of the per-channel layout: block g / head_dim, channel g % head_dim.
          auto run = [&](auto&& quantize, auto&& dequantize, Buffers& b, std::vector<float>& o) {
            if (per_channel) {
              for (int64_t blk = 0; blk < blocks; ++blk) {
                QuantGroups q = b.q;
                q.n_groups = head_dim;
                q.packed += blk * head_dim * q.group_bytes();
                q.scale += blk * head_dim;
                q.min += blk * head_dim;
                const int64_t offset = blk * group * head_dim;
                quantize(x.data() + offset, 1, head_dim, q);
                dequantize(q, o.data() + offset, 1, head_dim);
              }
            } else {
              quantize(x.data(), group, 1, b.q);
              dequantize(b.q, o.data(), group, 1);
            }
          };
          run(quantize_groups_cpu, dequantize_groups_cpu, kernel, out);
          run(quantize_groups_reference, dequantize_groups_reference, reference, ref_out);
          CHECK(kernel.packed == reference.packed);
          CHECK(kernel.scale == reference.scale);
          CHECK(kernel.min == reference.min);
          CHECK(out == ref_out);
          // Every value within half a step (plus float rounding) of its group's grid.
          int64_t bad = 0;
          for (int64_t t = 0; t < tokens; ++t) {
            for (int32_t c = 0; c < head_dim; ++c) {
              const int64_t i = t * head_dim + c;
              const int64_t g = per_channel ? (t / group) * head_dim + c : i / group;
              const float step = kernel.scale[static_cast<size_t>(g)];
              bad += std::fabs(out[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]) >
                     0.5f * step + 1e-5f;
            }
          }
          CHECK(bad == 0);
        }
      }
    }
  }
}

TEST_CASE("quantize: a constant group is exact, extremes land on the grid's ends", "[unit]") {
  std::vector<float> x(32, -0.75f);
  x[7] = 2.0f;  // group 0 spans -0.75..2; groups 1-3 are constant (groups of 8)
  Buffers b(4, 8, 2);
  quantize_groups_cpu(x.data(), 8, 1, b.q);
  CHECK(b.scale[1] == 0.0f);
  CHECK(b.scale[3] == 0.0f);
  std::vector<float> back(32);
  dequantize_groups_cpu(b.q, back.data(), 8, 1);
  for (size_t i = 8; i < 32; ++i) CHECK(back[i] == -0.75f);
  CHECK(back[0] == -0.75f);  // the group's minimum is stored exactly
  CHECK(back[7] == Approx(2.0f).epsilon(1e-6));
}
