#include "reuse/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/input_error.h"

namespace kvbench {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'K', 'V', 'B', 'Z', 'S', 'T', '0', '1'};

std::string errno_text(int err) { return std::strerror(err); }

// Keys made of safe characters name their file; others are hashed (the key inside the file
// still decides).
std::string file_name(const std::string& key) {
  bool safe = !key.empty() && key.size() <= 200 && key[0] != '.';
  for (char c : key) {
    safe =
        safe && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
  }
  if (safe) return key + ".zst";
  const XXH128_hash_t h = XXH3_128bits(key.data(), key.size());
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string("h-") + hex + ".zst";
}

void put_le(uint8_t* out, uint64_t value, int n) {
  for (int i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}
uint64_t get_le(const uint8_t* in, int n) {
  uint64_t value = 0;
  for (int i = 0; i < n; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

// Writes all of `data` to `path` (created, must not exist). "" or what failed.
std::string write_file(const std::string& path, const uint8_t* data, size_t n, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "create: " + errno_text(errno);
  std::string why;
  while (n > 0 && why.empty()) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      why = "write: " + (w < 0 ? errno_text(errno) : std::string("wrote nothing"));
      break;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  if (why.empty() && sync && ::fsync(fd) != 0) why = "fsync: " + errno_text(errno);
  // close reports deferred write errors on some file systems.
  if (::close(fd) != 0 && why.empty()) why = "close: " + errno_text(errno);
  return why;
}

// Reads the whole file. "" or what failed; ENOENT is reported as "missing".
std::string read_file(const std::string& path, Bytes& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? "missing" : "open: " + errno_text(errno);
  struct stat st;
  std::string why;
  if (::fstat(fd, &st) != 0) {
    why = "stat: " + errno_text(errno);
  } else {
    out.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t r = ::read(fd, out.data() + done, out.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        why = "read: " + errno_text(errno);
        break;
      }
      if (r == 0) {
        why = "shorter than its size";
        break;
      }
      done += static_cast<size_t>(r);
    }
  }
  ::close(fd);
  return why;
}

std::atomic<uint64_t> instance_counter{0};

}  // namespace

DiskTier::DiskTier(const std::string& dir, int zstd_level, bool sync)
    : level_(zstd_level), sync_(sync) {
  stats_.name = "disk";
  const std::string where = "disk tier directory '" + dir + "'";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw InputError(where + ": cannot create: " + (ec ? ec.message() : "not a directory"));
  }
  // A stale subdirectory of a dead process with our pid is left alone: take the next name.
  for (int attempt = 0;; ++attempt) {
    std::string candidate = (fs::path(dir) / ("kvbench-" + std::to_string(::getpid()) + "-" +
                                              std::to_string(instance_counter++)))
                                .string();
    if (::mkdir(candidate.c_str(), 0755) == 0) {
      dir_ = candidate;
      break;
    }
    if (errno != EEXIST || attempt > 1000) {
      throw InputError(where + ": cannot write: " + errno_text(errno));
    }
  }
  const std::string probe = dir_ + "/.probe";
  const uint8_t byte = 0;
  const std::string why = write_file(probe, &byte, 1, false);
  ::unlink(probe.c_str());
  cctx_ = ZSTD_createCCtx();
  dctx_ = ZSTD_createDCtx();
  if (!why.empty() || !cctx_ || !dctx_) {
    fs::remove_all(dir_, ec);
    ZSTD_freeCCtx(cctx_);
    ZSTD_freeDCtx(dctx_);
    throw InputError(where + ": cannot write: " + (why.empty() ? "zstd context" : why));
  }
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, level_);
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx_, ZSTD_c_contentSizeFlag, 1);
}

DiskTier::~DiskTier() {
  std::error_code ec;
  fs::remove_all(dir_, ec);  // best effort: a destructor has no one to tell
  ZSTD_freeCCtx(cctx_);
  ZSTD_freeDCtx(dctx_);
}

std::string DiskTier::path_of(const std::string& key) const { return dir_ + "/" + file_name(key); }

std::optional<int64_t> DiskTier::put(const std::string& key, const SharedBytes& value) {
  const std::string path = path_of(key);
  if (!value) {
    fault("disk " + path + ": no value");
    return std::nullopt;
  }
  const size_t header = sizeof kMagic + 4 + key.size() + 8;
  scratch_.resize(header + ZSTD_compressBound(value->size()));
  uint8_t* out = scratch_.data();
  std::memcpy(out, kMagic, sizeof kMagic);
  put_le(out + sizeof kMagic, key.size(), 4);
  std::memcpy(out + sizeof kMagic + 4, key.data(), key.size());
  put_le(out + header - 8, value->size(), 8);
  const size_t packed =
      ZSTD_compress2(cctx_, out + header, scratch_.size() - header, value->data(), value->size());
  if (ZSTD_isError(packed)) {
    fault("disk " + path + ": compress: " + ZSTD_getErrorName(packed));
    return std::nullopt;
  }
  const size_t total = header + packed;

  // Temp name in the same directory (rename is atomic only within a file system); the dot
  // keeps it apart from final names.
  const std::string temp = dir_ + "/." + file_name(key) + ".tmp-" + std::to_string(temp_counter_++);
  std::string why = write_file(temp, out, total, sync_);
  if (why.empty() && ::rename(temp.c_str(), path.c_str()) != 0)
    why = "rename: " + errno_text(errno);
  if (!why.empty()) {
    ::unlink(temp.c_str());
    erase(key);  // a failed put leaves the key absent, not an older value
    fault("disk " + path + ": " + why);
    return std::nullopt;
  }
  keys_[key] = value->size();
  return static_cast<int64_t>(total);
}

SharedBytes DiskTier::drop_bad(const std::string& key, const std::string& path,
                               const std::string& why) {
  fault("disk " + path + ": " + why + " (deleted)");
  ::unlink(path.c_str());
  keys_.erase(key);
  return nullptr;
}

SharedBytes DiskTier::get(const std::string& key) {
  const auto written = keys_.find(key);
  if (written == keys_.end()) return nullptr;
  const uint64_t expected = written->second;
  const std::string path = path_of(key);
  Bytes file;
  const std::string why = read_file(path, file);
  if (!why.empty()) return drop_bad(key, path, why);

  const size_t header = sizeof kMagic + 4 + key.size() + 8;
  if (file.size() < header || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) {
    return drop_bad(key, path, "not a kvbench zstd file");
  }
  if (get_le(file.data() + sizeof kMagic, 4) != key.size() ||
      std::memcmp(file.data() + sizeof kMagic + 4, key.data(), key.size()) != 0) {
    return drop_bad(key, path, "holds another key");
  }
  const uint64_t size = get_le(file.data() + header - 8, 8);
  const uint8_t* frame = file.data() + header;
  const size_t frame_bytes = file.size() - header;
  // The stored size, the frame's and the size written must all agree before allocating: a
  // flipped size byte must not cost a huge buffer, and zstd's "unknown" and "error" values
  // (the largest uint64s) must not pass as sizes.
  if (size != expected || ZSTD_getFrameContentSize(frame, frame_bytes) != size) {
    return drop_bad(key, path, "sizes disagree (truncated or corrupt)");
  }
  std::shared_ptr<Bytes> value;
  try {
    value = std::make_shared<Bytes>(size);
  } catch (const std::bad_alloc&) {
    return drop_bad(key, path,
                    "value of " + std::to_string(size) + " bytes does not fit in memory");
  }
  const size_t got = ZSTD_decompressDCtx(dctx_, value->data(), value->size(), frame, frame_bytes);
  if (ZSTD_isError(got)) return drop_bad(key, path, std::string("zstd: ") + ZSTD_getErrorName(got));
  if (got != size) return drop_bad(key, path, "decompressed to the wrong size");
  return value;
}

void DiskTier::erase(const std::string& key) {
  if (keys_.erase(key)) ::unlink(path_of(key).c_str());
}

}  // namespace kvbench
