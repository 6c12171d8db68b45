#include "reuse/cachegen_codec.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

#include "reuse/kv_block.h"

namespace kvbench {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'B', 'C', 'G', 'E', 'N', '1'};
constexpr size_t kHead = sizeof kMagic + 8;  // magic, u64 prefix bytes
constexpr size_t kTrailer = 8;               // XXH3-64

// Fewer than 4 bins leave no level beside zero; a byte holds bins - 1, so at most 256.
constexpr int kMinBins = 4;

void put_u64(uint8_t* out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}
uint64_t get_u64(const uint8_t* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

// The frame's contents for a block of L layers, T tokens, rows of W values.
struct InnerLayout {
  int64_t layers, tokens, width;
  int64_t bins_bytes() const { return 2 * layers; }
  int64_t scales_offset() const { return bins_bytes(); }
  int64_t codes_offset() const { return scales_offset() + 2 * layers * tokens * 4; }
  int64_t bytes() const { return codes_offset() + 2 * layers * tokens * width; }
};

InnerLayout inner_layout(const KvBlockLayout& block) {
  return InnerLayout{block.shape.n_layers, block.n_tokens, block.shape.kv_width()};
}

class CacheGenCodec : public BlockCodec {
 public:
  explicit CacheGenCodec(int level) : cctx_(ZSTD_createCCtx()), dctx_(ZSTD_createDCtx()) {
    if (!cctx_ || !dctx_) throw std::bad_alloc();
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_contentSizeFlag, 1);
  }
  ~CacheGenCodec() override {
    ZSTD_freeCCtx(cctx_);
    ZSTD_freeDCtx(dctx_);
  }
  CacheGenCodec(const CacheGenCodec&) = delete;
  CacheGenCodec& operator=(const CacheGenCodec&) = delete;

  Codec kind() const override { return Codec::CacheGen; }

  std::string encode(const SharedBytes& value, SharedBytes* out) override {
    // An intact block only: the decoder seals a fresh checksum, which must not launder
    // a corrupt one.
    KvBlockLayout block;
    const std::string bad = check_kv_block(value->data(), value->size(), &block);
    if (!bad.empty()) return "cachegen: " + bad;
    const InnerLayout in = inner_layout(block);
    inner_.resize(static_cast<size_t>(in.bytes()));
    const std::vector<int> key_bins = cachegen_key_bins(block.shape.n_layers);
    const std::vector<int> value_bins = cachegen_value_bins(block.shape.n_layers);
    const auto* payload = reinterpret_cast<const float*>(value->data() + block.payload_offset);
    auto* scales = reinterpret_cast<float*>(inner_.data() + in.scales_offset());
    uint8_t* codes = inner_.data() + in.codes_offset();
    for (int64_t layer = 0; layer < in.layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        const int64_t stream = 2 * layer + kv;
        const int bins = kv == 0 ? key_bins[layer] : value_bins[layer];
        inner_[stream] = static_cast<uint8_t>(bins - 1);  // 256 bins fit a byte as 255
        const std::string why =
            quantize(payload + stream * in.tokens * in.width, in.tokens, in.width, bins,
                     scales + stream * in.tokens, codes + stream * in.tokens * in.width);
        if (!why.empty()) {
          return "cachegen: " + why + " in layer " + std::to_string(layer) + (kv ? " V" : " K");
        }
      }
    }

    const size_t prefix = static_cast<size_t>(block.payload_offset);
    auto encoded =
        std::make_shared<Bytes>(kHead + prefix + ZSTD_compressBound(inner_.size()) + kTrailer);
    uint8_t* o = encoded->data();
    std::memcpy(o, kMagic, sizeof kMagic);
    put_u64(o + sizeof kMagic, prefix);
    std::memcpy(o + kHead, value->data(), prefix);
    uint8_t* frame = o + kHead + prefix;
    const size_t packed = ZSTD_compress2(cctx_, frame, encoded->size() - kHead - prefix - kTrailer,
                                         inner_.data(), inner_.size());
    if (ZSTD_isError(packed)) return std::string("cachegen: zstd: ") + ZSTD_getErrorName(packed);
    const size_t body = kHead + prefix + packed;
    put_u64(o + body, XXH3_64bits(o, body));
    encoded->resize(body + kTrailer);
    *out = std::move(encoded);
    return "";
  }

  std::string decode(const SharedBytes& encoded, uint64_t size, SharedBytes* out) override {
    const uint8_t* data = encoded->data();
    const size_t n = encoded->size();
    if (n < kHead + kTrailer) return "cachegen: truncated";
    if (std::memcmp(data, kMagic, sizeof kMagic) != 0) return "cachegen: not a cachegen encoding";
    if (XXH3_64bits(data, n - kTrailer) != get_u64(data + n - kTrailer)) {
      return "cachegen: checksum mismatch (truncated or corrupt)";
    }
    const uint64_t prefix = get_u64(data + sizeof kMagic);
    if (prefix > n - kHead - kTrailer) return "cachegen: truncated";
    KvBlockLayout block;
    // The prefix holds no payload: its layout is read from a buffer that ends with it.
    std::string bad = read_kv_block_layout(data + kHead, n - kHead, &block);
    if (!bad.empty()) return "cachegen: " + bad;
    if (static_cast<uint64_t>(block.payload_offset) != prefix) return "cachegen: bad prefix size";
    if (static_cast<uint64_t>(block.total_bytes) != size) {
      return "cachegen: sizes disagree (truncated or corrupt)";
    }
    const InnerLayout in = inner_layout(block);
    const uint8_t* frame = data + kHead + prefix;
    const size_t frame_bytes = n - kHead - prefix - kTrailer;
    if (ZSTD_getFrameContentSize(frame, frame_bytes) != static_cast<uint64_t>(in.bytes())) {
      return "cachegen: frame of the wrong size";
    }
    inner_.resize(static_cast<size_t>(in.bytes()));
    const size_t got = ZSTD_decompressDCtx(dctx_, inner_.data(), inner_.size(), frame, frame_bytes);
    if (ZSTD_isError(got)) return std::string("cachegen: zstd: ") + ZSTD_getErrorName(got);
    if (got != inner_.size()) return "cachegen: frame of the wrong size";

    std::shared_ptr<Bytes> value;
    try {
      value = std::make_shared<Bytes>(size);
    } catch (const std::bad_alloc&) {
      return "cachegen: block of " + std::to_string(size) + " bytes does not fit in memory";
    }
    std::memcpy(value->data(), data + kHead, prefix);
    auto* payload = reinterpret_cast<float*>(value->data() + prefix);
    const auto* scales = reinterpret_cast<const float*>(inner_.data() + in.scales_offset());
    const uint8_t* codes = inner_.data() + in.codes_offset();
    for (int64_t stream = 0; stream < 2 * in.layers; ++stream) {
      const int bins = inner_[stream] + 1;
      bad = dequantize(codes + stream * in.tokens * in.width, scales + stream * in.tokens,
                       in.tokens, in.width, bins, payload + stream * in.tokens * in.width);
      if (!bad.empty()) return "cachegen: " + bad;
    }
    seal_kv_block(value->data(), value->size());
    *out = std::move(value);
    return "";
  }

 private:
  // rows [tokens, width] -> scales [tokens], codes [width, tokens] (per channel, over tokens).
  static std::string quantize(const float* rows, int64_t tokens, int64_t width, int bins,
                              float* scales, uint8_t* codes) {
    const int c = bins / 2 - 1;
    for (int64_t t = 0; t < tokens; ++t) {
      const float* row = rows + t * width;
      float amax = 0;
      for (int64_t i = 0; i < width; ++i) {
        const float a = std::fabs(row[i]);
        if (!(a <= std::numeric_limits<float>::max())) return "non-finite KV";
        amax = std::max(amax, a);
      }
      scales[t] = amax;
      const float factor = amax > 0 ? static_cast<float>(c) / amax : 0.0f;
      for (int64_t i = 0; i < width; ++i) {
        const long q = std::clamp(std::lrint(row[i] * factor), -static_cast<long>(c),
                                  static_cast<long>(c));
        codes[i * tokens + t] = static_cast<uint8_t>(q + c);
      }
    }
    return "";
  }

  static std::string dequantize(const uint8_t* codes, const float* scales, int64_t tokens,
                                int64_t width, int bins, float* rows) {
    if (bins < kMinBins || bins % 2 != 0) return "bad bin count " + std::to_string(bins);
    const int c = bins / 2 - 1;
    uint8_t top = 0;
    for (int64_t i = 0; i < tokens * width; ++i) top = std::max(top, codes[i]);
    if (top > 2 * c) return "code out of range";
    for (int64_t t = 0; t < tokens; ++t) {
      if (!(scales[t] >= 0 && scales[t] <= std::numeric_limits<float>::max())) {
        return "bad scale";
      }
      const float step = scales[t] / static_cast<float>(c);
      float* row = rows + t * width;
      for (int64_t i = 0; i < width; ++i) {
        row[i] = static_cast<float>(static_cast<int>(codes[i * tokens + t]) - c) * step;
      }
    }
    return "";
  }

  ZSTD_CCtx_s* cctx_;
  ZSTD_DCtx_s* dctx_;
  Bytes inner_;  // the frame's contents, reused across calls
};

}  // namespace

std::vector<int> cachegen_key_bins(int32_t n_layers) {
  std::vector<int> bins(static_cast<size_t>(std::max(n_layers, 0)), 32);
  if (n_layers >= 10) std::fill(bins.begin() + 10, bins.end(), 16);
  return bins;
}

std::vector<int> cachegen_value_bins(int32_t n_layers) {
  std::vector<int> bins(static_cast<size_t>(std::max(n_layers, 0)), 32);
  if (n_layers >= 10) std::fill(bins.begin() + 2, bins.end(), 16);
  return bins;
}

std::unique_ptr<BlockCodec> make_cachegen_codec(int zstd_level) {
  return std::make_unique<CacheGenCodec>(zstd_level);
}

}  // namespace kvbench
