#include "common/files.h"

#include <sys/stat.h>

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

void check_writable(const std::string& path, const char* what) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  const std::string tmp = path + ".tmp";
  std::ofstream probe(tmp, std::ios::binary | std::ios::trunc);
  const bool ok = static_cast<bool>(probe);
  const std::string why = ok ? "" : std::strerror(errno);
  probe.close();
  std::filesystem::remove(tmp, ec);
  if (!ok) throw InputError(path + ": cannot write the " + what + " (" + why + ")");
}

void write_file_atomically(const std::string& path, const std::string& text, const char* what) {
  const std::string tmp = path + ".tmp";
  const auto fail = [&](const std::string& why) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw InputError(path + ": cannot write the " + what + " (" + why + ")");
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(std::strerror(errno));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) fail(errno ? std::strerror(errno) : "write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(ec.message());
}

}  // namespace kvbench
