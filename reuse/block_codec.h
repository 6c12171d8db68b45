// How a slow tier (disk, Redis) encodes a value before it stores it, and decodes it on load:
// LMCache's serializers ("serde"). Three codecs:
//   raw       store-only: the encoding is the value itself (no copy, no decode);
//   zstd      one zstd frame (level 1, content checksum on): lossless, but fp32 KV barely
//             compresses (about 0.92 of raw);
//   cachegen  CacheGen's quantization with zstd as its entropy coder (reuse/cachegen_codec.h):
//             lossy, for KV blocks only; a decoded block holds the approximated KV.
// Every decode checks what it reads: a truncated, corrupt or foreign encoding is refused
// with a reason, never decoded into wrong data (raw has no check of its own: a tier that
// stores raw values checks them itself, and a KV block carries its checksum).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "reuse/tier.h"

namespace kvbench {

enum class Codec { Raw, Zstd, CacheGen };
Codec parse_codec(const std::string& text);  // InputError unless raw, zstd or cachegen
const char* to_string(Codec codec);

class BlockCodec {
 public:
  virtual ~BlockCodec() = default;
  virtual Codec kind() const = 0;
  // "" and the encoding of `value` in `out` (raw: `value` itself), or why it cannot be
  // encoded (cachegen: not an intact KV block, or non-finite KV).
  virtual std::string encode(const SharedBytes& value, SharedBytes* out) = 0;
  // "" and the value in `out` (raw: `encoded` itself), or why not. The value must come out
  // `size` bytes, what the tier recorded at put: a hostile size never sizes a buffer.
  virtual std::string decode(const SharedBytes& encoded, uint64_t size, SharedBytes* out) = 0;
};

// A codec of `codec`'s kind; `zstd_level` sets zstd's level and cachegen's entropy coder's.
std::unique_ptr<BlockCodec> make_block_codec(Codec codec, int zstd_level = 1);

}  // namespace kvbench
