#include "store/writer_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/input_error.h"

namespace kvbench {

namespace {

constexpr const char* kLockFdVariable = "KVBENCH_DB_LOCK_FD";

bool same_file(int fd, const std::string& path) {
  struct stat a {}, b {};
  return fstat(fd, &a) == 0 && stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

}  // namespace

WriterLock::WriterLock(const std::string& db_path) {
  if (const char* inherited = std::getenv(kLockFdVariable)) {
    char* end = nullptr;
    const long fd = std::strtol(inherited, &end, 10);
    // A worker's descriptor shares its parent's lock: taking it again through that
    // descriptor succeeds. One the environment names on the same file without the lock (an
    // outsider's `KVBENCH_DB_LOCK_FD=7 ... 7<db`) is no way around a sweep that holds it: the
    // flock is taken through it here, and refused while another holds it.
    if (end != inherited && *end == '\0' && fd >= 0 && fd < 1 << 20 &&
        same_file(static_cast<int>(fd), db_path)) {
      if (flock(static_cast<int>(fd), LOCK_EX | LOCK_NB) != 0) {
        throw InputError(one_line(db_path) +
                         ": another kvbench sweep is writing this results db; wait for it "
                         "(then resume) or give another --db");
      }
      fd_ = static_cast<int>(fd);
      inherited_ = true;
      return;
    }
  }
  fd_ = ::open(db_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    throw InputError(one_line(db_path) + ": cannot open the results db to lock it (" +
                     std::strerror(errno) + ")");
  }
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      throw InputError(one_line(db_path) +
                       ": another kvbench sweep is writing this results db; wait for it "
                       "(then resume) or give another --db");
    }
    throw InputError(one_line(db_path) + ": cannot lock the results db (" +
                     std::strerror(err) + ")");
  }
}

WriterLock::~WriterLock() {
  if (fd_ >= 0 && !inherited_) ::close(fd_);  // closing releases the flock
}

void WriterLock::keep_across_exec() const { fcntl(fd_, F_SETFD, 0); }

std::string WriterLock::environment_entry() const {
  return std::string(kLockFdVariable) + "=" + std::to_string(fd_);
}

}  // namespace kvbench
