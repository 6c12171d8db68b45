#include "kernels/cpu/block_layout.h"

#include "kernels/cpu/half.h"

namespace kvbench::block_layout {

void dequant_block(BlockFormat format, const uint8_t* blk, float* out) {
  switch (format) {
    case BlockFormat::Q4_0: {
      const float d = half_to_float(load_u16(blk));
      for (int i = 0; i < 16; ++i) {
        out[i] = static_cast<float>((blk[2 + i] & 0x0F) - 8) * d;
        out[i + 16] = static_cast<float>((blk[2 + i] >> 4) - 8) * d;
      }
      break;
    }
    case BlockFormat::Q4_1: {
      const float d = half_to_float(load_u16(blk));
      const float m = half_to_float(load_u16(blk + 2));
      for (int i = 0; i < 16; ++i) {
        out[i] = static_cast<float>(blk[4 + i] & 0x0F) * d + m;
        out[i + 16] = static_cast<float>(blk[4 + i] >> 4) * d + m;
      }
      break;
    }
    case BlockFormat::Q8_0: {
      const float d = half_to_float(load_u16(blk));
      for (int i = 0; i < 32; ++i) out[i] = static_cast<float>(static_cast<int8_t>(blk[2 + i])) * d;
      break;
    }
    case BlockFormat::Q5_0:
    case BlockFormat::Q5_1: {
      // Q4's nibbles with a fifth bit: bit e of the 32-bit qh is element e's bit 4.
      const bool q5_1 = format == BlockFormat::Q5_1;
      const float d = half_to_float(load_u16(blk));
      const float m = q5_1 ? half_to_float(load_u16(blk + 2)) : 0.0f;
      const uint8_t* qh = blk + (q5_1 ? 4 : 2);
      const uint32_t bits = static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
                            static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
      const uint8_t* qs = qh + 4;
      const int zero = q5_1 ? 0 : 16;
      for (int i = 0; i < 16; ++i) {
        const int lo = static_cast<int>((qs[i] & 0x0F) | (((bits >> i) & 1) << 4)) - zero;
        const int hi = static_cast<int>((qs[i] >> 4) | (((bits >> (i + 16)) & 1) << 4)) - zero;
        out[i] = static_cast<float>(lo) * d + m;
        out[i + 16] = static_cast<float>(hi) * d + m;
      }
      break;
    }
    case BlockFormat::Q4_K: {
      const float d = half_to_float(load_u16(blk));
      const float dmin = half_to_float(load_u16(blk + 2));
      for (int j = 0; j < kSuper / kBlock; ++j) {
        int sc, mn;
        q4_k_scale_min(j, blk + kQ4_KScales, &sc, &mn);
        const float dj = d * static_cast<float>(sc);
        const float mj = dmin * static_cast<float>(mn);
        const uint8_t* q = blk + kQ4_KQs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; ++l) {
          out[32 * j + l] = dj * static_cast<float>((q[l] >> shift) & 0x0F) - mj;
        }
      }
      break;
    }
    case BlockFormat::Q6_K: {
      const float d = half_to_float(load_u16(blk + kQ6_KD));
      const auto* scales = reinterpret_cast<const int8_t*>(blk + kQ6_KScales);
      for (int e = 0; e < kSuper; ++e) {
        const int h = e / 128, g = (e / 32) % 4, l = e % 32;
        const int lo = (blk[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0F;
        const int hi = (blk[kQ6_KQh + 32 * h + l] >> (2 * g)) & 3;
        // ggml's order, (d * scale) * q, so the values equal dequantize_row's.
        out[e] = d * static_cast<float>(scales[8 * h + 2 * g + l / 16]) *
                 static_cast<float>((lo | hi << 4) - 32);
      }
      break;
    }
    case BlockFormat::F32:
      std::memcpy(out, blk, kBlock * sizeof(float));
      break;
  }
}

}  // namespace kvbench::block_layout
