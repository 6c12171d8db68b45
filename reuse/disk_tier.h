// A tier of files in a local directory, one file per value, encoded by the tier's codec
// (reuse/block_codec.h: zstd by default, raw to store only, cachegen), written atomically: a
// temp file in the same directory, then rename, so a file under its final name is always
// whole. A file that cannot be read, verified or decoded is a miss and a fault (last_fault
// names the file and why), and is deleted.
//
// Each instance writes under its own subdirectory, <dir>/kvbench-<pid>-<n>, removed with its
// files by the destructor: runs sharing a directory are independent and repeatable, and
// nothing is reused across processes.
//
// File layout: magic ("KVBZST01", "KVBRAW01" or "KVBCGN01", the codec's), u32 key length,
// key, u64 value size, the codec's encoding, XXH3-64 of the encoding (all little-endian). The
// key inside catches a file under the wrong name; the checksum catches a corrupt file
// whatever the codec (a raw file has no check of its own). A raw value is written from its
// buffer and read into its own, with no copy and no decode.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "reuse/block_codec.h"
#include "reuse/tier.h"

namespace kvbench {

class DiskTier : public Tier {
 public:
  // Throws InputError naming `dir` when it (or the instance's subdirectory) cannot be
  // created or written. zstd at level 1 by default: fp32 KV compresses little, so slower
  // levels buy little. `sync` fsyncs each file before its rename (off: the files die with
  // the run).
  explicit DiskTier(const std::string& dir, Codec codec = Codec::Zstd, int zstd_level = 1,
                    bool sync = false);
  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const std::string& name() const override { return stats_.name; }
  // Returns the file's size. A value the codec cannot encode is a fault (nullopt).
  std::optional<int64_t> put(const std::string& key, const SharedBytes& value) override;
  SharedBytes get(const std::string& key) override;
  void erase(const std::string& key) override;

  const std::string& directory() const { return dir_; }  // this instance's subdirectory
  Codec codec() const { return codec_->kind(); }
  std::string path_of(const std::string& key) const;     // the file that holds `key`

 private:
  SharedBytes drop_bad(const std::string& key, const std::string& path, const std::string& why);

  std::string dir_;
  std::unique_ptr<BlockCodec> codec_;
  bool sync_;
  uint64_t temp_counter_ = 0;
  // Keys written and not dropped (a missing file is a fault), with their value sizes.
  std::unordered_map<std::string, uint64_t> keys_;
};

}  // namespace kvbench
