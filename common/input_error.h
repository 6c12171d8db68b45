// A user-caused problem with an input (a file, a spec string, a task name); the message
// names the input and what was expected. The CLI prints it as one line and exits 2.
#pragma once

#include <stdexcept>
#include <string>

namespace kvbench {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Messages echo input (a spec, a JSONL id, a path) that may hold newlines or other control
// characters: the CLI prints every error through this, so that it stays one line.
inline std::string one_line(const std::string& text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace kvbench
