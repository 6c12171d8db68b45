#include "common/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/input_error.h"

namespace kvbench {

namespace {

std::string absolute_lexical(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::absolute(path, ec);
  return (ec ? std::filesystem::path(path) : p).lexically_normal().string();
}

}  // namespace

void require_regular_file(const std::string& path, const char* what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw InputError(path + ": cannot open the " + what + " (" + std::strerror(errno) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    throw InputError(path + ": the " + what + " is not a regular file");
  }
}

std::string read_regular_file(const std::string& path, const char* what, uint64_t max_bytes) {
  require_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read the " + what);
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof(buffer)) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > max_bytes) {
      throw InputError(path + ": the " + what + " is larger than " +
                       std::to_string(max_bytes >> 20) + " MiB");
    }
  }
  if (in.bad()) throw InputError(path + ": cannot read the " + what);
  return text;
}

void check_output_file(const std::string& output, const std::vector<std::string>& inputs,
                       const char* what) {
  struct stat out {};
  const bool exists = ::stat(output.c_str(), &out) == 0;
  if (exists && !S_ISREG(out.st_mode)) {
    throw InputError(std::string(what) + " " + output +
                     ": exists and is not a regular file; nothing written");
  }
  const std::string out_abs = absolute_lexical(output);
  for (const std::string& input : inputs) {
    struct stat in {};
    const bool same_file = exists && ::stat(input.c_str(), &in) == 0 &&
                           in.st_dev == out.st_dev && in.st_ino == out.st_ino;
    if (same_file || absolute_lexical(input) == out_abs) {
      throw InputError(std::string(what) + " " + output + ": is also an input (" + input +
                       "); nothing written");
    }
  }
}

namespace {

// A new file beside `path`, created with O_EXCL|O_NOFOLLOW under a name of its own
// (mkstemp's `path.tmp.XXXXXX`), so that a symlink or another writer's temporary planted
// there is never written through. Returns its descriptor and sets *tmp; -1 and errno on failure.
int create_temporary(const std::string& path, std::string* tmp) {
  std::string name = path + ".tmp.XXXXXX";
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd >= 0) *tmp = name;
  return fd;
}

}  // namespace

void check_writable(const std::string& path, const char* what) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::string tmp;
  const int fd = create_temporary(path, &tmp);
  if (fd < 0) throw InputError(path + ": cannot write the " + what + " (" + std::strerror(errno) + ")");
  ::close(fd);
  ::unlink(tmp.c_str());
}

namespace {

// `text` in a new temporary beside `path`, fsynced; returns its name. Throws InputError
// naming `path` (the temporary removed) when it cannot be written whole.
std::string write_temporary(const std::string& path, const std::string& text, const char* what) {
  std::string tmp;
  const int fd = create_temporary(path, &tmp);
  if (fd < 0) throw InputError(path + ": cannot write the " + what + " (" + std::strerror(errno) + ")");
  const auto fail = [&](const std::string& why) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw InputError(path + ": cannot write the " + what + " (" + why + ")");
  };
  // The file's mode as a plain create would give it (mkstemp makes it 0600).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0) fail(std::strerror(errno));
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(n < 0 ? std::strerror(errno) : "write failed");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail(std::strerror(errno));
  ::close(fd);
  return tmp;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text, const char* what) {
  write_files_atomically({{path, text}}, what);
}

void write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files,
                            const char* what) {
  std::vector<std::string> temporaries;
  try {
    for (const auto& [path, text] : files) temporaries.push_back(write_temporary(path, text, what));
  } catch (const InputError&) {
    for (const std::string& tmp : temporaries) ::unlink(tmp.c_str());
    throw;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (::rename(temporaries[i].c_str(), files[i].first.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      for (size_t j = i; j < files.size(); ++j) ::unlink(temporaries[j].c_str());
      throw InputError(files[i].first + ": cannot write the " + what + " (" + why + ")");
    }
  }
}

FolderLock::FolderLock(const std::string& path, const char* what) {
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  fd_ = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rc = -1;
  if (fd_ >= 0) {
    do rc = ::flock(fd_, LOCK_EX);
    while (rc != 0 && errno == EINTR);
  }
  if (rc != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw InputError(path + ": cannot lock the folder of the " + what + " (" + why + ")");
  }
}

FolderLock::~FolderLock() { ::close(fd_); }  // closing releases the flock

}  // namespace kvbench
