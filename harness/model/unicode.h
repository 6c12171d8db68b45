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

// Decodes UTF-8 into code points with llama.cpp's rules (lead byte and continuation bytes are
// checked; overlong forms and surrogates are accepted). Each invalid byte becomes one code
// point, its byte value | kInvalidByteFlag, so that the caller can re-encode it unchanged.
constexpr uint32_t kInvalidByteFlag = 0x80000000u;
std::vector<uint32_t> utf8_to_code_points(const std::string& text);
// Appends the UTF-8 of a code point; a kInvalidByteFlag value is written back as its byte.
void append_utf8(uint32_t code_point, std::string& out);
std::string code_point_to_utf8(uint32_t code_point);

// The classes the pre-tokenizer regexes test, as llama.cpp defines them (Unicode 15.1;
// whitespace is the White_Space property). Invalid and unassigned code points are Other.
enum class CodePointClass : uint8_t { Other, Letter, Number, Punctuation, Whitespace };
CodePointClass code_point_class(uint32_t cp);

bool is_letter(uint32_t cp);       // \p{L}
bool is_number(uint32_t cp);       // \p{N}
bool is_whitespace(uint32_t cp);   // \s
bool is_punctuation(uint32_t cp);  // \p{P}

}  // namespace kvbench
