#include "reuse/block_codec.h"

#include <zstd.h>

#include <new>

#include "common/input_error.h"
#include "reuse/cachegen_codec.h"

namespace kvbench {

namespace {

class RawCodec : public BlockCodec {
 public:
  Codec kind() const override { return Codec::Raw; }
  std::string encode(const SharedBytes& value, SharedBytes* out) override {
    *out = value;
    return "";
  }
  std::string decode(const SharedBytes& encoded, uint64_t size, SharedBytes* out) override {
    if (encoded->size() != size) return "raw value of the wrong size (truncated or corrupt)";
    *out = encoded;
    return "";
  }
};

class ZstdCodec : public BlockCodec {
 public:
  explicit ZstdCodec(int level) : cctx_(ZSTD_createCCtx()), dctx_(ZSTD_createDCtx()) {
    if (!cctx_ || !dctx_) throw std::bad_alloc();
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_contentSizeFlag, 1);
  }
  ~ZstdCodec() override {
    ZSTD_freeCCtx(cctx_);
    ZSTD_freeDCtx(dctx_);
  }
  ZstdCodec(const ZstdCodec&) = delete;
  ZstdCodec& operator=(const ZstdCodec&) = delete;

  Codec kind() const override { return Codec::Zstd; }

  std::string encode(const SharedBytes& value, SharedBytes* out) override {
    auto frame = std::make_shared<Bytes>(ZSTD_compressBound(value->size()));
    const size_t packed =
        ZSTD_compress2(cctx_, frame->data(), frame->size(), value->data(), value->size());
    if (ZSTD_isError(packed)) return std::string("compress: ") + ZSTD_getErrorName(packed);
    frame->resize(packed);
    *out = std::move(frame);
    return "";
  }

  std::string decode(const SharedBytes& encoded, uint64_t size, SharedBytes* out) override {
    // The frame's size must be the one recorded before allocating: zstd's "unknown" and
    // "error" values (the largest uint64s) must not pass as sizes.
    if (ZSTD_getFrameContentSize(encoded->data(), encoded->size()) != size) {
      return "sizes disagree (truncated or corrupt)";
    }
    std::shared_ptr<Bytes> value;
    try {
      value = std::make_shared<Bytes>(size);
    } catch (const std::bad_alloc&) {
      return "value of " + std::to_string(size) + " bytes does not fit in memory";
    }
    const size_t got =
        ZSTD_decompressDCtx(dctx_, value->data(), value->size(), encoded->data(), encoded->size());
    if (ZSTD_isError(got)) return std::string("zstd: ") + ZSTD_getErrorName(got);
    if (got != size) return "decompressed to the wrong size";
    *out = std::move(value);
    return "";
  }

 private:
  ZSTD_CCtx_s* cctx_;
  ZSTD_DCtx_s* dctx_;
};

}  // namespace

Codec parse_codec(const std::string& text) {
  if (text == "raw") return Codec::Raw;
  if (text == "zstd") return Codec::Zstd;
  if (text == "cachegen") return Codec::CacheGen;
  throw InputError("tier codec '" + text + "': expected raw, zstd or cachegen");
}

const char* to_string(Codec codec) {
  switch (codec) {
    case Codec::Raw:
      return "raw";
    case Codec::Zstd:
      return "zstd";
    case Codec::CacheGen:
      return "cachegen";
  }
  return "?";
}

std::unique_ptr<BlockCodec> make_block_codec(Codec codec, int zstd_level) {
  switch (codec) {
    case Codec::Raw:
      return std::make_unique<RawCodec>();
    case Codec::Zstd:
      return std::make_unique<ZstdCodec>(zstd_level);
    case Codec::CacheGen:
      return make_cachegen_codec(zstd_level);
  }
  return nullptr;
}

}  // namespace kvbench
