// Writes the binary seeds of the fuzz corpora (corpus/fuzz_gguf, corpus/fuzz_kv_block): a
// small GGUF of every metadata type, tiny llama models, a valid KV block, its cachegen
// encoding and a disk-tier file, so that the fuzzers start from inputs that get past the
// magic and the checksum. The text seeds
// (configs, specs, JSONL, templates) are committed as written by hand.
//   write_seeds CORPUS_DIR
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../gguf_writer.h"
#include "reuse/block_codec.h"
#include "reuse/disk_tier.h"
#include "reuse/kv_block.h"

using namespace kvbench;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_seeds CORPUS_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  testing::write_file(dir + "/fuzz_gguf/small.gguf", testing::small_gguf_bytes());
  testing::TinyLlamaSpec tiny;
  tiny.n_layer = 1;
  tiny.n_embd = 32;
  tiny.n_head = 2;
  tiny.n_head_kv = 1;
  tiny.n_ff = 32;
  testing::write_tiny_llama_gguf(dir + "/fuzz_gguf/tiny_llama.gguf", tiny);
  tiny.qkv_bias = true;
  tiny.llama3_rope_scaling = true;
  tiny.weight_type = GgmlType::Q4_0;
  testing::write_tiny_llama_gguf(dir + "/fuzz_gguf/tiny_llama_bias_rope.gguf", tiny);

  // The block fuzz_kv_block asks for: key 'a' x 64, model 'b' x 64, shape 2 x 2 x 8, tokens
  // 7 7 7 7. Its first byte (the magic's) is odd, so the target seals the checksum.
  const std::vector<int32_t> tokens(4, 7);
  KvBlockWriter writer(std::string(64, 'a'), std::string(64, 'b'), KvBlockShape{2, 2, 8},
                       tokens.data(), 4, 0);
  for (int32_t l = 0; l < 2; ++l) {
    for (int i = 0; i < 4 * 16; ++i) writer.k(l)[i] = writer.v(l)[i] = 0.5f * i;
  }
  const SharedBytes block = writer.finish();
  testing::write_file(dir + "/fuzz_kv_block/block.bin", *block);
  SharedBytes encoded;
  if (!make_block_codec(Codec::CacheGen)->encode(block, &encoded).empty()) return 1;
  testing::write_file(dir + "/fuzz_kv_block/block.cgn", *encoded);
  // The disk file fuzz_kv_block reads: 100 bytes of 42 under the key 'a' x 64, zstd.
  DiskTier tier(testing::temp_path("seeds"));
  if (!tier.put(std::string(64, 'a'), std::make_shared<const Bytes>(Bytes(100, 42)))) return 1;
  testing::write_file(dir + "/fuzz_kv_block/disk.zst",
                      testing::read_file_bytes(tier.path_of(std::string(64, 'a'))));
  return 0;
}
