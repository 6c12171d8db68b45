#include "reuse/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/uio.h>
#include <xxhash.h>

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

constexpr size_t kMagicBytes = 8;
constexpr size_t kTrailer = 8;  // XXH3-64 of the encoding

const char* magic_of(Codec codec) {
  switch (codec) {
    case Codec::Raw:
      return "KVBRAW01";
    case Codec::Zstd:
      return "KVBZST01";
    case Codec::CacheGen:
      return "KVBCGN01";
  }
  return "KVB?????";
}

const char* extension_of(Codec codec) {
  switch (codec) {
    case Codec::Raw:
      return ".raw";
    case Codec::Zstd:
      return ".zst";
    case Codec::CacheGen:
      return ".cgn";
  }
  return ".kvb";
}

std::string errno_text(int err) { return std::strerror(err); }

// Keys made of safe characters name their file; others are hashed (the key inside the file
// still decides).
std::string file_name(const std::string& key, const char* extension) {
  bool safe = !key.empty() && key.size() <= 200 && key[0] != '.';
  for (char c : key) {
    safe =
        safe && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
  }
  if (safe) return key + extension;
  const XXH128_hash_t h = XXH3_128bits(key.data(), key.size());
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string("h-") + hex + extension;
}

void put_le(uint8_t* out, uint64_t value, int n) {
  for (int i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}
uint64_t get_le(const uint8_t* in, int n) {
  uint64_t value = 0;
  for (int i = 0; i < n; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

// Writes the `n` pieces to `path` (created, must not exist). "" or what failed.
std::string write_file(const std::string& path, struct iovec* pieces, int n, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "create: " + errno_text(errno);
  std::string why;
  while (n > 0 && why.empty()) {
    if (pieces->iov_len == 0) {
      ++pieces;
      --n;
      continue;
    }
    const ssize_t w = ::writev(fd, pieces, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      why = "write: " + (w < 0 ? errno_text(errno) : std::string("wrote nothing"));
      break;
    }
    for (auto left = static_cast<size_t>(w); left > 0;) {  // past what was written
      const size_t step = std::min(left, pieces->iov_len);
      pieces->iov_base = static_cast<uint8_t*>(pieces->iov_base) + step;
      pieces->iov_len -= step;
      left -= step;
      if (pieces->iov_len == 0) {
        ++pieces;
        --n;
      }
    }
  }
  if (why.empty() && sync && ::fsync(fd) != 0) why = "fsync: " + errno_text(errno);
  // close reports deferred write errors on some file systems.
  if (::close(fd) != 0 && why.empty()) why = "close: " + errno_text(errno);
  return why;
}

std::string write_bytes(const std::string& path, const uint8_t* data, size_t n) {
  struct iovec piece = {const_cast<uint8_t*>(data), n};
  return write_file(path, &piece, 1, false);
}

// Reads exactly `n` bytes from `fd` into `out`. "" or what failed.
std::string read_exact(int fd, uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::read(fd, out + done, n - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return "read: " + errno_text(errno);
    if (r == 0) return "shorter than its size";
    done += static_cast<size_t>(r);
  }
  return "";
}

// Reads the file of `key`, whose value was `size` bytes, from `fd`: checks its header and its
// checksum. "" and the encoding (in its own buffer: a raw value is served as read), or why not.
std::string read_encoding(int fd, Codec codec, const std::string& key, uint64_t size,
                          SharedBytes* out) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return "stat: " + errno_text(errno);
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  const size_t header = kMagicBytes + 4 + key.size() + 8;
  if (file_bytes < header + kTrailer) return "truncated";
  Bytes head(header);
  std::string why = read_exact(fd, head.data(), header);
  if (!why.empty()) return why;
  if (std::memcmp(head.data(), magic_of(codec), kMagicBytes) != 0) {
    return std::string("not a kvbench ") + to_string(codec) + " file";
  }
  if (get_le(head.data() + kMagicBytes, 4) != key.size() ||
      std::memcmp(head.data() + kMagicBytes + 4, key.data(), key.size()) != 0) {
    return "holds another key";
  }
  // Checked before the codec sizes anything by it: a flipped size byte must not cost a huge
  // buffer. The encoding's buffer is bounded by the file.
  if (get_le(head.data() + header - 8, 8) != size) return "sizes disagree (truncated or corrupt)";
  auto encoding = std::make_shared<Bytes>(file_bytes - header - kTrailer);
  uint8_t trailer[kTrailer];
  why = read_exact(fd, encoding->data(), encoding->size());
  if (why.empty()) why = read_exact(fd, trailer, kTrailer);
  if (!why.empty()) return why;
  if (XXH3_64bits(encoding->data(), encoding->size()) != get_le(trailer, 8)) {
    return "checksum mismatch (corrupt)";
  }
  *out = std::move(encoding);
  return "";
}

std::atomic<uint64_t> instance_counter{0};

}  // namespace

DiskTier::DiskTier(const std::string& dir, Codec codec, int zstd_level, bool sync)
    : codec_(make_block_codec(codec, zstd_level)), sync_(sync) {
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
  const std::string why = write_bytes(probe, &byte, 1);
  ::unlink(probe.c_str());
  if (!why.empty()) {
    fs::remove_all(dir_, ec);
    throw InputError(where + ": cannot write: " + why);
  }
}

DiskTier::~DiskTier() {
  std::error_code ec;
  fs::remove_all(dir_, ec);  // best effort: a destructor has no one to tell
}

std::string DiskTier::path_of(const std::string& key) const {
  return dir_ + "/" + file_name(key, extension_of(codec_->kind()));
}

std::optional<int64_t> DiskTier::put(const std::string& key, const SharedBytes& value) {
  const std::string path = path_of(key);
  if (!value) {
    fault("disk " + path + ": no value");
    return std::nullopt;
  }
  SharedBytes encoded;
  const std::string bad = codec_->encode(value, &encoded);
  if (!bad.empty()) {
    erase(key);  // a failed put leaves the key absent, not an older value
    fault("disk " + path + ": " + bad);
    return std::nullopt;
  }
  Bytes header(kMagicBytes + 4 + key.size() + 8);
  std::memcpy(header.data(), magic_of(codec_->kind()), kMagicBytes);
  put_le(header.data() + kMagicBytes, key.size(), 4);
  std::memcpy(header.data() + kMagicBytes + 4, key.data(), key.size());
  put_le(header.data() + header.size() - 8, value->size(), 8);
  uint8_t trailer[kTrailer];
  put_le(trailer, XXH3_64bits(encoded->data(), encoded->size()), 8);
  struct iovec pieces[3] = {{header.data(), header.size()},
                            {const_cast<uint8_t*>(encoded->data()), encoded->size()},
                            {trailer, kTrailer}};
  const size_t total = header.size() + encoded->size() + kTrailer;

  // Temp name in the same directory (rename is atomic only within a file system); the dot
  // keeps it apart from final names.
  const std::string temp = dir_ + "/." + file_name(key, extension_of(codec_->kind())) + ".tmp-" +
                           std::to_string(temp_counter_++);
  std::string why = write_file(temp, pieces, 3, sync_);
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
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return drop_bad(key, path, errno == ENOENT ? "missing" : "open: " + errno_text(errno));
  }
  SharedBytes encoding;
  const std::string why = read_encoding(fd, codec_->kind(), key, expected, &encoding);
  ::close(fd);
  if (!why.empty()) return drop_bad(key, path, why);
  SharedBytes value;
  const std::string bad = codec_->decode(encoding, expected, &value);
  if (!bad.empty()) return drop_bad(key, path, bad);
  return value;
}

void DiskTier::erase(const std::string& key) {
  if (keys_.erase(key)) ::unlink(path_of(key).c_str());
}

}  // namespace kvbench
