// The codecs of the slow reuse tiers (reuse/block_codec.h): raw and zstd round trips bit for
// bit, cachegen within half a quantization step per value with LMCache's per-layer bins,
// the bytes each stores for a KV-like block, corrupt, truncated and hostile encodings
// refused, and the disk tier and the tiered store serving decoded blocks.
#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/input_error.h"
#include "reuse/block_codec.h"
#include "reuse/cachegen_codec.h"
#include "reuse/disk_tier.h"
#include "reuse/kv_block.h"
#include "reuse/tiered_store.h"
#include "tests/gguf_writer.h"
#include "tests/random_floats.h"

namespace kvbench {
namespace {

namespace fs = std::filesystem;

const std::string kKey(64, 'k');
const std::string kModel(64, 'm');

// 12 layers (both of LMCache's bin regimes), 2 KV heads of 64, 64 tokens.
constexpr KvBlockShape kShape{12, 2, 64};
constexpr int64_t kTokens = 64;

std::vector<int32_t> block_tokens() {
  std::vector<int32_t> tokens(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) tokens[i] = static_cast<int32_t>(1000 + 7 * i);
  return tokens;
}

// A block whose rows look like a model's KV: normal values, each channel with its own scale,
// and in keys a few channels 20x the rest (the outlier channels of post-RoPE keys).
SharedBytes kv_block(uint32_t seed) {
  const std::vector<int32_t> tokens = block_tokens();
  KvBlockWriter writer(kKey, kModel, kShape, tokens.data(), kTokens, 128);
  const int64_t width = kShape.kv_width();
  const std::vector<float> noise = testing::random_floats(2 * kShape.n_layers * kTokens * width, seed);
  const std::vector<float> channel = testing::random_floats(width, seed + 1);
  size_t at = 0;
  for (int32_t l = 0; l < kShape.n_layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      float* rows = kv == 0 ? writer.k(l) : writer.v(l);
      for (int64_t t = 0; t < kTokens; ++t) {
        for (int64_t c = 0; c < width; ++c) {
          const float scale = 0.5f + std::abs(channel[c]) * (kv == 0 && c % 37 == 5 ? 20 : 1);
          rows[t * width + c] = noise[at++] * scale;
        }
      }
    }
  }
  return writer.finish();
}

KvBlockView view_of(const Bytes& bytes) {
  const std::vector<int32_t> tokens = block_tokens();
  KvBlockView view;
  const std::string why = decode_kv_block(bytes, kKey, kModel, kShape, tokens.data(), kTokens, &view);
  INFO(why);
  REQUIRE(why.empty());
  return view;
}

SharedBytes encode(BlockCodec& codec, const SharedBytes& value) {
  SharedBytes out;
  const std::string why = codec.encode(value, &out);
  INFO(why);
  REQUIRE(why.empty());
  REQUIRE(out);
  return out;
}

std::string decode_error(BlockCodec& codec, const Bytes& encoded, uint64_t size) {
  SharedBytes out;
  const std::string why = codec.decode(std::make_shared<Bytes>(encoded), size, &out);
  if (why.empty()) CHECK(out);
  return why;
}

// Largest |decoded - original| over a row, as a multiple of the row's bound (amax / 2C).
double worst_error_in_steps(const float* original, const float* decoded, int64_t width,
                            int bins) {
  float amax = 0;
  for (int64_t c = 0; c < width; ++c) amax = std::max(amax, std::abs(original[c]));
  double worst = 0;
  for (int64_t c = 0; c < width; ++c) {
    worst = std::max(worst, std::abs(static_cast<double>(decoded[c]) - original[c]));
  }
  return worst / cachegen_max_error(amax, bins);
}

// Re-seals an encoding's trailing XXH3, as a hostile writer would.
void reseal(Bytes& encoded) {
  const uint64_t sum = XXH3_64bits(encoded.data(), encoded.size() - 8);
  std::memcpy(encoded.data() + encoded.size() - 8, &sum, 8);
}

}  // namespace

TEST_CASE("codecs parse and print", "[unit]") {
  for (const Codec codec : {Codec::Raw, Codec::Zstd, Codec::CacheGen}) {
    CHECK(parse_codec(to_string(codec)) == codec);
    CHECK(make_block_codec(codec)->kind() == codec);
  }
  REQUIRE_THROWS_AS(parse_codec("lz4"), InputError);
  REQUIRE_THROWS_WITH(parse_codec("lz4"), Catch::Contains("lz4"));
}

TEST_CASE("raw and zstd give back the block bit for bit; raw is the block itself", "[unit]") {
  const SharedBytes block = kv_block(1);
  auto raw = make_block_codec(Codec::Raw);
  const SharedBytes stored = encode(*raw, block);
  CHECK(stored == block);  // no copy
  SharedBytes back;
  REQUIRE(raw->decode(stored, block->size(), &back).empty());
  CHECK(back == stored);  // no decode
  auto zstd = make_block_codec(Codec::Zstd);
  REQUIRE(zstd->decode(encode(*zstd, block), block->size(), &back).empty());
  CHECK(*back == *block);
}

TEST_CASE("cachegen: LMCache's bins, more for early layers", "[unit]") {
  const std::vector<int> keys = cachegen_key_bins(24), values = cachegen_value_bins(24);
  REQUIRE(keys.size() == 24);
  for (int l = 0; l < 24; ++l) {
    CHECK(keys[l] == (l < 10 ? 32 : 16));
    CHECK(values[l] == (l < 2 ? 32 : 16));
  }
  CHECK(cachegen_key_bins(8) == std::vector<int>(8, 32));
  CHECK(cachegen_value_bins(8) == std::vector<int>(8, 32));
}

TEST_CASE("cachegen: every value within half a step of its row's scale", "[unit]") {
  const SharedBytes block = kv_block(2);
  auto codec = make_block_codec(Codec::CacheGen);
  SharedBytes back;
  const std::string why = codec->decode(encode(*codec, block), block->size(), &back);
  INFO(why);
  REQUIRE(why.empty());
  REQUIRE(back->size() == block->size());
  // The decoded block is a block of the same key, model, tokens and position, sealed anew.
  const KvBlockView original = view_of(*block), decoded = view_of(*back);
  CHECK(decoded.first_position == 128);
  const std::vector<int> key_bins = cachegen_key_bins(kShape.n_layers);
  const std::vector<int> value_bins = cachegen_value_bins(kShape.n_layers);
  const int64_t width = kShape.kv_width();
  for (int32_t l = 0; l < kShape.n_layers; ++l) {
    double worst_k = 0, worst_v = 0, sum_error = 0;
    for (int64_t t = 0; t < kTokens; ++t) {
      const int64_t row = t * width;
      worst_k = std::max(worst_k, worst_error_in_steps(original.k(l) + row, decoded.k(l) + row,
                                                       width, key_bins[l]));
      worst_v = std::max(worst_v, worst_error_in_steps(original.v(l) + row, decoded.v(l) + row,
                                                       width, value_bins[l]));
      for (int64_t c = 0; c < width; ++c) sum_error += std::abs(original.k(l)[row + c] - decoded.k(l)[row + c]);
    }
    INFO("layer " << l);
    CHECK(worst_k <= 1.0 + 1e-5);  // rounding to the nearest level: at most half a step
    CHECK(worst_v <= 1.0 + 1e-5);
    CHECK(worst_k > 0.5);  // lossy: the bound is reached, not merely respected
    CHECK(sum_error > 0);
  }
  // More bins, smaller steps: layer 0's keys (32 bins) are closer than layer 11's (16).
  auto mean_key_error = [&](int32_t l) {
    double sum = 0;
    for (int64_t i = 0; i < kTokens * width; ++i) sum += std::abs(original.k(l)[i] - decoded.k(l)[i]);
    return sum / static_cast<double>(kTokens * width);
  };
  CHECK(mean_key_error(0) < 0.7 * mean_key_error(11));
}

TEST_CASE("cachegen: zero rows stay zero, signs and the extremes are kept", "[unit]") {
  const std::vector<int32_t> tokens = block_tokens();
  KvBlockWriter writer(kKey, kModel, kShape, tokens.data(), kTokens, 0);
  const int64_t width = kShape.kv_width();
  for (int32_t l = 0; l < kShape.n_layers; ++l) {
    for (int64_t i = 0; i < kTokens * width; ++i) {
      writer.k(l)[i] = i < width ? 0.0f : static_cast<float>((i % 9) - 4) * 0.25f;
      writer.v(l)[i] = i % width == 0 ? -3.0f : 1e-3f;
    }
  }
  const SharedBytes block = writer.finish();
  auto codec = make_block_codec(Codec::CacheGen);
  SharedBytes back;
  REQUIRE(codec->decode(encode(*codec, block), block->size(), &back).empty());
  const KvBlockView decoded = view_of(*back);
  for (int32_t l = 0; l < kShape.n_layers; ++l) {
    for (int64_t c = 0; c < width; ++c) CHECK(decoded.k(l)[c] == 0.0f);  // the all-zero row
    CHECK(decoded.k(l)[135] == -1.0f);  // the row's largest magnitude (135 % 9 == 0) is exact
    CHECK(decoded.k(l)[136] == Approx(-0.75f).margin(cachegen_max_error(1.0, 16)));
    CHECK(decoded.v(l)[0] == -3.0f);
    CHECK(decoded.v(l)[1] >= 0.0f);  // a tenth of a step rounds to zero, never below
  }
}

TEST_CASE("bytes each codec stores for a KV block", "[unit]") {
  const SharedBytes block = kv_block(3);
  const auto raw = static_cast<int64_t>(block->size());
  CHECK(raw == kv_block_bytes(kShape, kTokens));
  const int64_t zstd = static_cast<int64_t>(encode(*make_block_codec(Codec::Zstd), block)->size());
  const int64_t cachegen =
      static_cast<int64_t>(encode(*make_block_codec(Codec::CacheGen), block)->size());
  // fp32 normals: zstd can only pack the exponent bytes (about a tenth saved).
  CHECK(zstd > raw * 8 / 10);
  CHECK(zstd < raw);
  // CacheGen: a byte-sized code per value before entropy coding, 31 or 15 levels (at most
  // 5 or 4 bits), plus an fp32 scale per row and the block's header and tokens.
  const int64_t values = 2 * kShape.n_layers * kTokens * kShape.kv_width();
  const int64_t scales = 2 * kShape.n_layers * kTokens * 4;
  const int64_t prefix = raw - values * 4 - 8;
  int64_t bits = 0;
  const std::vector<int> key_bins = cachegen_key_bins(kShape.n_layers);
  const std::vector<int> value_bins = cachegen_value_bins(kShape.n_layers);
  for (int32_t l = 0; l < kShape.n_layers; ++l) {
    bits += kTokens * kShape.kv_width() *
            static_cast<int64_t>(std::ceil(std::log2(key_bins[l] - 1) + std::log2(value_bins[l] - 1)));
  }
  CHECK(cachegen < prefix + scales + bits / 8);  // entropy coding beats fixed-width codes
  CHECK(cachegen > prefix + scales + bits / 8 / 2);  // normal values: no more than half of it
  CHECK(cachegen < raw / 6);
}

TEST_CASE("corrupt, truncated and hostile encodings are refused", "[unit]") {
  const SharedBytes block = kv_block(4);
  const uint64_t size = block->size();
  for (const Codec kind : {Codec::Zstd, Codec::CacheGen}) {
    auto codec = make_block_codec(kind);
    const Bytes good = *encode(*codec, block);
    INFO(to_string(kind));
    CHECK(decode_error(*codec, good, size).empty());
    CHECK_FALSE(decode_error(*codec, good, size - 1).empty());  // not the size recorded
    CHECK_FALSE(decode_error(*codec, good, ~uint64_t{0}).empty());
    for (const size_t at : {size_t{0}, size_t{9}, size_t{20}, good.size() / 2, good.size() - 1}) {
      Bytes flipped = good;
      flipped[at] ^= 0x5a;
      INFO("flipped at " << at);
      CHECK_FALSE(decode_error(*codec, flipped, size).empty());
    }
    for (const size_t keep : {size_t{0}, size_t{8}, size_t{24}, good.size() / 2, good.size() - 1}) {
      INFO("cut to " << keep);
      CHECK_FALSE(decode_error(*codec, Bytes(good.begin(), good.begin() + keep), size).empty());
    }
  }
  auto raw = make_block_codec(Codec::Raw);
  CHECK_FALSE(decode_error(*raw, Bytes(block->begin(), block->end() - 1), size).empty());
}

TEST_CASE("cachegen: an encoding with a valid checksum but bad contents is refused", "[unit]") {
  const SharedBytes block = kv_block(5);
  auto codec = make_block_codec(Codec::CacheGen);
  const Bytes good = *encode(*codec, block);
  const size_t prefix_at = 16;  // magic and the prefix's size come first
  SECTION("the block header's shape") {
    Bytes bad = good;
    int32_t layers = 1 << 20;
    std::memcpy(bad.data() + prefix_at + 136, &layers, 4);  // Header::n_layers
    reseal(bad);
    CHECK_THAT(decode_error(*codec, bad, block->size()), Catch::Contains("out of bounds"));
  }
  SECTION("the prefix's size") {
    Bytes bad = good;
    bad[8] ^= 0x01;
    reseal(bad);
    CHECK_FALSE(decode_error(*codec, bad, block->size()).empty());
  }
  SECTION("the frame") {
    Bytes bad = good;
    bad[bad.size() - 20] ^= 0xff;
    reseal(bad);
    CHECK_FALSE(decode_error(*codec, bad, block->size()).empty());
  }
}

TEST_CASE("cachegen encodes intact KV blocks only", "[unit]") {
  auto codec = make_block_codec(Codec::CacheGen);
  SharedBytes out;
  CHECK_THAT(codec->encode(std::make_shared<Bytes>(1000, uint8_t{7}), &out),
             Catch::Contains("not a kvbench KV block"));
  Bytes corrupt = *kv_block(6);
  corrupt[corrupt.size() / 2] ^= 1;
  CHECK_THAT(codec->encode(std::make_shared<Bytes>(corrupt), &out), Catch::Contains("checksum"));
  const std::vector<int32_t> tokens = block_tokens();
  KvBlockWriter writer(kKey, kModel, kShape, tokens.data(), kTokens, 0);
  for (int32_t l = 0; l < kShape.n_layers; ++l) {
    std::fill(writer.k(l), writer.k(l) + kTokens * kShape.kv_width(), 1.0f);
    std::fill(writer.v(l), writer.v(l) + kTokens * kShape.kv_width(), 1.0f);
  }
  writer.v(3)[17] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THAT(codec->encode(writer.finish(), &out), Catch::Contains("non-finite KV in layer 3 V"));
}

TEST_CASE("disk tier with each codec: round trips, file sizes, a corrupt file is a miss", "[unit]") {
  const SharedBytes block = kv_block(7);
  for (const Codec kind : {Codec::Raw, Codec::Zstd, Codec::CacheGen}) {
    INFO(to_string(kind));
    DiskTier tier(testing::temp_path(std::string("codec-disk-") + to_string(kind)), kind);
    CHECK(tier.codec() == kind);
    const auto stored = tier.put("k", block);
    REQUIRE(stored);
    const std::string path = tier.path_of("k");
    CHECK(*stored == static_cast<int64_t>(fs::file_size(path)));
    const int64_t overhead = 8 + 4 + 1 + 8 + 8;  // magic, key, size, checksum
    if (kind == Codec::Raw) CHECK(*stored == static_cast<int64_t>(block->size()) + overhead);
    if (kind == Codec::CacheGen) CHECK(*stored < static_cast<int64_t>(block->size()) / 6);
    const SharedBytes back = tier.get("k");
    REQUIRE(back);
    if (kind == Codec::CacheGen) {
      CHECK(*back != *block);  // lossy: the decoded block
      view_of(*back);
    } else {
      CHECK(*back == *block);
    }
    Bytes file = testing::read_file_bytes(path);
    file[file.size() / 2] ^= 0x5a;
    testing::write_file(path, file);
    CHECK(tier.get("k") == nullptr);
    CHECK(tier.stats().faults == 1);
    CHECK_THAT(tier.stats().last_fault, Catch::Contains(path));
    CHECK_FALSE(fs::exists(path));
  }
}

TEST_CASE("disk tier: a value cachegen cannot encode is a fault and leaves no older value",
          "[unit]") {
  DiskTier tier(testing::temp_path("codec-disk-refused"), Codec::CacheGen);
  REQUIRE(tier.put("k", kv_block(8)));
  CHECK_FALSE(tier.put("k", std::make_shared<Bytes>(100, uint8_t{1})));
  CHECK(tier.stats().faults == 1);
  CHECK_THAT(tier.stats().last_fault, Catch::Contains("cachegen"));
  CHECK(tier.get("k") == nullptr);
  CHECK_FALSE(fs::exists(tier.path_of("k")));
}

TEST_CASE("the store serves a cachegen disk tier's decoded block, and promotes that", "[unit]") {
  const SharedBytes block = kv_block(9);
  TierConfig config;
  config.device_bytes = static_cast<int64_t>(block->size());  // one block
  config.disk_dir = testing::temp_path("codec-store");
  config.disk_codec = Codec::CacheGen;
  TieredStore store(config);
  store.put("a", block);
  store.put("b", kv_block(10));  // evicts a from device
  std::string from;
  const SharedBytes served = store.get("a", &from);
  REQUIRE(served);
  CHECK(from == "disk");
  CHECK(*served != *block);
  view_of(*served);  // a whole block, checksum and all
  CHECK(store.get("a", &from) == served);  // promoted: device now holds the decoded block
  CHECK(from == "device");
  const TierStats disk = store.stats().back();
  CHECK(disk.bytes_in == 2 * static_cast<int64_t>(block->size()));
  CHECK(disk.bytes_out == static_cast<int64_t>(block->size()));
  CHECK(disk.bytes_resident < disk.bytes_in / 6);
  CHECK(disk.faults == 0);
}

}  // namespace kvbench
