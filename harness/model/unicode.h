// UTF-8 and the Unicode facts the byte-level BPE pre-tokenizer needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvbench {

// GPT-2's reversible byte -> printable code point map, as UTF-8 ("Ġ" for the space byte).
const std::string& byte_to_token_char(uint8_t byte);
// Inverse: one code point of the byte-level alphabet -> its byte; -1 if not in the alphabet.
int token_char_to_byte(uint32_t code_point);

// Decodes UTF-8 into code points; invalid bytes become one code point each in
// 0xDC80..0xDCFF-free form: they are kept as their byte value | 0x80000000 so that the
// caller can re-encode them unchanged.
std::vector<uint32_t> utf8_to_code_points(const std::string& text);
std::string code_point_to_utf8(uint32_t code_point);

// Unicode general categories used by the pre-tokenizer regexes.
bool is_letter(uint32_t cp);      // \p{L}
bool is_number(uint32_t cp);      // \p{N}
bool is_whitespace(uint32_t cp);  // \s
bool is_punctuation(uint32_t cp);  // \p{P}

}  // namespace kvbench
