// One sweep at a time writes a results db. Two would compute the same units, and the second
// would fail at its first write with a run row left unfinished. The lock is an advisory
// flock on the db file, taken before any work and held while the sweep runs (SQLite's own
// locks are fcntl locks, which flock does not touch on Linux). `sweep --jobs N` hands its
// lock to its workers: they inherit the locked descriptor, named in their environment.
#pragma once

#include <string>
#include <vector>

namespace kvbench {

class WriterLock {
 public:
  // Throws InputError naming the db when another process holds its lock. A worker whose
  // inherited KVBENCH_DB_LOCK_FD is open on the same file shares its parent's lock.
  explicit WriterLock(const std::string& db_path);
  ~WriterLock();
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

  // For a worker process: call after fork, before exec (async-signal-safe: fcntl only).
  // The descriptor stays open across exec; `environment_entry()` names it.
  void keep_across_exec() const;
  std::string environment_entry() const;  // "KVBENCH_DB_LOCK_FD=<fd>"

 private:
  int fd_ = -1;
  bool inherited_ = false;
};

}  // namespace kvbench
