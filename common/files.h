// Files a command reads and writes, checked before any work: an input must be a regular file
// (not a FIFO that blocks the open, not /dev/zero that never ends) and is read up to a cap;
// an output must not be one of the command's inputs and, where it exists, must be a regular
// file, so that `check v.db --write-baseline v.db` or `--write-baseline /dev/full` writes
// nothing. Outputs are written whole or not at all. Framework-free; errors are InputError
// with one line naming the file.
#pragma once

#include <cstdint>
#include <string>
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

// Throws unless `path` can be written: creates its directory and `path.tmp` (then removes
// it), so that a command fails before its work rather than after.
void check_writable(const std::string& path, const char* what);

// Writes `text` to `path.tmp` and renames it over `path`; the stream is checked on close
// and the .tmp file removed on any failure. `what` names the file in errors.
void write_file_atomically(const std::string& path, const std::string& text, const char* what);

}  // namespace kvbench
