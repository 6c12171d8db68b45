#include "harness/model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/input_error.h"

namespace kvbench {

MappedFile::MappedFile(const std::string& path, const std::string& what) {
  // O_NONBLOCK: a FIFO given as the file opens at once (and is refused below) instead of
  // waiting for a writer; it changes nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw InputError(path + ": cannot open (" + std::strerror(errno) + "); expected " + what);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path + ": not a regular file; expected " + what);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* addr = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw InputError(path + ": cannot memory-map (" + std::strerror(err) + ")");
    }
    addr_ = addr;
  }
  ::close(fd);  // the mapping stays valid without the descriptor
}

MappedFile::MappedFile(MappedFile&& other) noexcept : addr_(other.addr_), size_(other.size_) {
  other.addr_ = nullptr;
  other.size_ = 0;
}

MappedFile::~MappedFile() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
}

}  // namespace kvbench
