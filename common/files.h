// Files a command reads and writes, checked before any work: an input must be a regular file
// (not a FIFO that blocks the open, not /dev/zero that never ends) and is read up to a cap;
// an output must not be one of the command's inputs and, where it exists, must be a regular
// file, so that `check v.db --write-baseline v.db` or `--write-baseline /dev/full` writes
// nothing. Outputs are written whole or not at all. Framework-free; errors are InputError
// with one line naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace kvbench {

// The whole of a regular file of at most `max_bytes`; `what` names it in errors ("baseline").
std::string read_regular_file(const std::string& path, const char* what,
                              uint64_t max_bytes = uint64_t{64} << 20);

// Throws unless `path` is a regular file (following symlinks), naming it and `what`.
void require_regular_file(const std::string& path, const char* what);

// Throws when `output` names the same file as one of `inputs` (same device and inode, or the
// same path once made absolute), or exists and is not a regular file. `what` names the
// option ("--write-baseline").
void check_output_file(const std::string& output, const std::vector<std::string>& inputs,
                       const char* what);

// Throws unless `path` can be written: creates its directory and a temporary file beside
// `path` (then removes it), so that a command fails before its work rather than after.
void check_writable(const std::string& path, const char* what);

// Writes `text` to a new temporary file beside `path` (created O_EXCL|O_NOFOLLOW under a
// unique name, so neither a symlink planted there nor another writer's temporary is
// written through), fsyncs it and renames it over `path`; the temporary is removed on any
// failure. `what` names the file in errors.
void write_file_atomically(const std::string& path, const std::string& text, const char* what);

// Several files (path, text) as write_file_atomically writes one, all or none: every
// temporary is written and fsynced before the first rename, so a failure to write one (a full
// disk) leaves every old file as it was.
void write_files_atomically(const std::vector<std::pair<std::string, std::string>>& files,
                            const char* what);

// An exclusive flock on the folder of `path`, held for a read-modify-write of that file by
// several kvbench processes (two calibrations of one model into one file): the file itself
// is replaced by a rename, so a lock on it would not serialize anything. Blocks until the
// lock is free; released on destruction. Throws InputError naming `what` where the folder
// cannot be opened or locked.
class FolderLock {
 public:
  FolderLock(const std::string& path, const char* what);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace kvbench
