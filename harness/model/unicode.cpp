#include "harness/model/unicode.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace kvbench {

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68
// bytes to 256, 257, ... in byte order.
struct ByteMap {
  std::array<std::string, 256> to_char;
  std::array<int, 512> from_cp;
  ByteMap() {
    from_cp.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const int cp = printable ? b : next++;
      to_char[b] = code_point_to_utf8(static_cast<uint32_t>(cp));
      from_cp[cp] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

const std::string& byte_to_token_char(uint8_t byte) { return byte_map().to_char[byte]; }

int token_char_to_byte(uint32_t code_point) {
  return code_point < 512 ? byte_map().from_cp[code_point] : -1;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp & kInvalidByteFlag) {
    out += static_cast<char>(cp & 0xFF);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string code_point_to_utf8(uint32_t cp) {
  std::string out;
  append_utf8(cp, out);
  return out;
}

std::vector<uint32_t> utf8_to_code_points(const std::string& text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint32_t b = s[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (b < 0x80) {
      len = 1;
      cp = b;
    } else if ((b & 0xE0) == 0xC0) {
      len = 2;
      cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3;
      cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4;
      cp = b & 0x07;
    }
    bool valid = len > 0 && i + len <= n;
    for (size_t k = 1; valid && k < len; ++k) {
      valid = (s[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // F4 90.. and F5..F7 leads decode past U+10FFFF, which no UTF-8 writer can emit again.
    if (valid && cp > 0x10FFFF) valid = false;
    if (valid) {
      cps.push_back(cp);
      i += len;
    } else {
      cps.push_back(kInvalidByteFlag | b);
      i += 1;
    }
  }
  return cps;
}

namespace {

struct ClassRange {
  uint32_t first;
  uint8_t cls;
};

constexpr ClassRange kClassRanges[] = {
#include "harness/model/unicode_tables.inc"
};

// Dense table for the BMP (64 KiB) so that the common case is one load; binary search above.
struct BmpClasses {
  std::array<uint8_t, 0x10000> cls;
  BmpClasses() {
    const size_t n = sizeof(kClassRanges) / sizeof(kClassRanges[0]);
    for (size_t r = 0; r < n; ++r) {
      const uint32_t end = r + 1 < n ? kClassRanges[r + 1].first : 0x110000;
      for (uint32_t cp = kClassRanges[r].first; cp < end && cp < 0x10000; ++cp) {
        cls[cp] = kClassRanges[r].cls;
      }
    }
  }
};

const BmpClasses& bmp_classes() {
  static const BmpClasses table;
  return table;
}

}  // namespace

CodePointClass code_point_class(uint32_t cp) {
  if (cp < 0x10000) return static_cast<CodePointClass>(bmp_classes().cls[cp]);
  if (cp >= 0x110000) return CodePointClass::Other;  // invalid bytes included
  const auto* end = std::end(kClassRanges);
  const auto* it = std::upper_bound(std::begin(kClassRanges), end, cp,
                                    [](uint32_t v, const ClassRange& r) { return v < r.first; });
  return static_cast<CodePointClass>((it - 1)->cls);
}

bool is_letter(uint32_t cp) { return code_point_class(cp) == CodePointClass::Letter; }
bool is_number(uint32_t cp) { return code_point_class(cp) == CodePointClass::Number; }
bool is_whitespace(uint32_t cp) { return code_point_class(cp) == CodePointClass::Whitespace; }
bool is_punctuation(uint32_t cp) { return code_point_class(cp) == CodePointClass::Punctuation; }

}  // namespace kvbench
