#include "reports/html_text.h"

namespace kvbench {

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      case '=': out += "&#61;"; break;  // "onerror=" cannot survive even as text
      case ':':
        if (s.compare(i + 1, 2, "//") == 0) {
          out += "&#58;";
        } else {
          out += c;
        }
        break;
      default:
        // NUL and the other control bytes from a db: shown as U+FFFD, never passed through.
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
          out += "\xEF\xBF\xBD";
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string markdown_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '|': case '\\': case '`': case '*': case '_': case '[': case ']':
        out += '\\';
        out += c;
        break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '\n': case '\r': case '\t': out += ' '; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          out += "\xEF\xBF\xBD";
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string truncate_text(const std::string& s, size_t n) {
  size_t chars = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (chars == n - 1) break;
      ++chars;
    }
  }
  if (i >= s.size()) return s;
  // Would the rest fit in one more character?
  size_t rest = 0;
  for (size_t j = i; j < s.size(); ++j) rest += (static_cast<unsigned char>(s[j]) & 0xC0) != 0x80;
  if (rest <= 1) return s;
  return s.substr(0, i) + "\xE2\x80\xA6";
}

}  // namespace kvbench
