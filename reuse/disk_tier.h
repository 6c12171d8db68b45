// A tier of files in a local directory, one zstd frame per value (content checksum on),
// written atomically: a temp file in the same directory, then rename, so a file under its
// final name is always whole. A file that cannot be read, decompressed or verified is a miss
// and a fault (last_fault names the file and why), and is deleted.
//
// Each instance writes under its own subdirectory, <dir>/kvbench-<pid>-<n>, removed with its
// files by the destructor: runs sharing a directory are independent and repeatable, and
// nothing is reused across processes.
//
// File layout: magic "KVBZST01", u32 key length, key, u64 value size, zstd frame (all
// little-endian). The key inside catches a file under the wrong name.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "reuse/tier.h"

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace kvbench {

class DiskTier : public Tier {
 public:
  // Throws InputError naming `dir` when it (or the instance's subdirectory) cannot be
  // created or written. Level 1 by default: fp32 KV compresses little, so slower levels buy
  // little. `sync` fsyncs each file before its rename (off: the files die with the run).
  explicit DiskTier(const std::string& dir, int zstd_level = 1, bool sync = false);
  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const std::string& name() const override { return stats_.name; }
  // Returns the file's size.
  std::optional<int64_t> put(const std::string& key, const SharedBytes& value) override;
  SharedBytes get(const std::string& key) override;
  void erase(const std::string& key) override;

  const std::string& directory() const { return dir_; }  // this instance's subdirectory
  std::string path_of(const std::string& key) const;     // the file that holds `key`

 private:
  SharedBytes drop_bad(const std::string& key, const std::string& path, const std::string& why);

  std::string dir_;
  int level_;
  bool sync_;
  uint64_t temp_counter_ = 0;
  // Keys written and not dropped (a missing file is a fault), with their value sizes.
  std::unordered_map<std::string, uint64_t> keys_;
  Bytes scratch_;                         // the encoded file, reused across puts
  ZSTD_CCtx_s* cctx_ = nullptr;
  ZSTD_DCtx_s* dctx_ = nullptr;
};

}  // namespace kvbench
