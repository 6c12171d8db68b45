// The KV blocks the reuse tiers store: decode_kv_block on any bytes (with the checksum
// sealed half the time, so that the checks behind it are reached), the zstd and cachegen
// codecs' decoders (their checksums sealed alike), and the disk tier's file format through
// DiskTier::get on a file overwritten with the input (its trailing checksum sealed alike).
// The seal bits are set in 'K', the first byte of every magic, so seeds stay sealed.
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "reuse/block_codec.h"
#include "reuse/disk_tier.h"
#include "reuse/kv_block.h"

using namespace kvbench;

namespace {

const std::string kKey(64, 'a');
const std::string kModel(64, 'b');
const KvBlockShape kShape{2, 2, 8};

void decode_block(const uint8_t* data, size_t size) {
  Bytes bytes(data, data + size);
  if (size > 8 && (data[0] & 1)) {  // seal: the checksum of everything before it
    const uint64_t sum = XXH3_64bits(bytes.data(), size - 8);
    std::memcpy(bytes.data() + size - 8, &sum, 8);
  }
  const std::vector<int32_t> tokens(4, 7);
  KvBlockView view;
  const std::string why = decode_kv_block(bytes, kKey, kModel, kShape, tokens.data(), 4, &view);
  if (!why.empty()) return;
  FUZZ_CHECK(static_cast<int64_t>(size) == kv_block_bytes(kShape, 4));
  float sum = 0;  // every payload float lies inside the bytes (ASan)
  for (int32_t l = 0; l < kShape.n_layers; ++l) sum += view.k(l)[0] + view.v(l)[4 * 16 - 1];
  (void)sum;
}

// Writes the XXH3 of bytes [from, size - 8) into the last 8 bytes.
void seal_tail(Bytes& bytes, size_t from) {
  if (bytes.size() < from + 8) return;
  const uint64_t sum = XXH3_64bits(bytes.data() + from, bytes.size() - 8 - from);
  std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
}

void decode_codecs(const uint8_t* data, size_t size) {
  static const auto zstd = make_block_codec(Codec::Zstd);
  static const auto cachegen = make_block_codec(Codec::CacheGen);
  auto bytes = std::make_shared<Bytes>(data, data + size);
  if (size > 0 && (data[0] & 2)) seal_tail(*bytes, 0);  // cachegen's trailer ('K' & 2)
  const auto block_bytes = static_cast<uint64_t>(kv_block_bytes(kShape, 4));
  for (BlockCodec* codec : {zstd.get(), cachegen.get()}) {
    SharedBytes value;
    if (!codec->decode(bytes, block_bytes, &value).empty()) continue;
    FUZZ_CHECK(value && value->size() == block_bytes);
    if (codec == cachegen.get()) {  // a cachegen decoding is a whole, sealed block
      KvBlockLayout layout;
      FUZZ_CHECK(check_kv_block(value->data(), value->size(), &layout).empty());
    }
  }
}

void read_disk_file(const uint8_t* data, size_t size) {
  static DiskTier tier(std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp"));
  const auto value = std::make_shared<const Bytes>(Bytes(100, 42));
  FUZZ_CHECK(tier.put(kKey, value).has_value());
  {
    Bytes file(data, data + size);
    // The file's checksum covers what follows its header (magic, key length, key, size).
    if (size > 0 && (data[0] & 1)) seal_tail(file, 8 + 4 + kKey.size() + 8);
    std::ofstream out(tier.path_of(kKey), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(size));
  }
  const SharedBytes got = tier.get(kKey);
  if (got) FUZZ_CHECK(got->size() == value->size());
  tier.erase(kKey);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  decode_block(data, size);
  decode_codecs(data, size);
  read_disk_file(data, size);
  return 0;
}
