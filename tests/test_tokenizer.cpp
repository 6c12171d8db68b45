// Byte-level BPE on a hand-built vocab: merges by rank, special-token splitting, the
// pre-tokenizer regex sets, round trips and invalid UTF-8. The real vocab against llama.cpp's
// ids is in test_tokenizer_model.cpp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf_writer.h"
#include "harness/model/gguf.h"
#include "harness/model/tokenizer.h"
#include "harness/model/unicode.h"

namespace kvbench {
namespace {

using Pieces = std::vector<std::string>;

// Ids 0..4 are special, 5..260 the byte tokens, then one token per merge, in merge order.
constexpr int32_t kByteBase = 5;

VocabData tiny_vocab(const std::vector<std::pair<std::string, std::string>>& merges,
                     const std::string& pre = "gpt2") {
  VocabData v;
  v.pre = pre;
  auto add = [&](const std::string& text, TokenType type) {
    v.tokens.push_back(text);
    v.token_types.push_back(type);
  };
  add("<|endoftext|>", TokenType::CONTROL);
  add("<|im_start|>", TokenType::CONTROL);
  add("<|im_end|>", TokenType::CONTROL);
  add("<|im_start|>x", TokenType::CONTROL);  // contains another special token
  add("<tool>", TokenType::USER_DEFINED);
  for (int b = 0; b < 256; ++b) add(byte_to_token_char(static_cast<uint8_t>(b)), TokenType::NORMAL);
  for (const auto& [left, right] : merges) {
    v.merges.push_back(left + " " + right);
    add(left + right, TokenType::NORMAL);
  }
  v.bos_id = 0;
  v.eos_id = 2;
  return v;
}

const std::vector<std::pair<std::string, std::string>> kWordMerges = {
    {"h", "e"}, {"l", "l"},   {"he", "ll"}, {"hell", "o"},  {"Ġ", "w"},
    {"o", "r"}, {"Ġw", "or"}, {"l", "d"},   {"Ġwor", "ld"}, {"x", "x"},
};

int32_t byte_id(char c) { return kByteBase + static_cast<uint8_t>(c); }

// Token texts of an encoding, decoded, for readable comparisons.
Pieces token_pieces(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  Pieces out;
  for (int32_t id : ids) out.push_back(tok.token_text(id));
  return out;
}

TEST_CASE("Merges apply lowest rank first, leftmost first among equal ranks", "[unit]") {
  const Tokenizer words(tiny_vocab(kWordMerges));
  CHECK(token_pieces(words, words.encode("hello world")) == Pieces{"hello", " world"});
  CHECK(token_pieces(words, words.encode("xxx")) == Pieces{"xx", "x"});
  CHECK(token_pieces(words, words.encode("xxxxx")) == Pieces{"xx", "xx", "x"});
  CHECK(words.encode("q") == std::vector<int32_t>{byte_id('q')});

  const Tokenizer bc_first(tiny_vocab({{"b", "c"}, {"a", "b"}}));
  CHECK(token_pieces(bc_first, bc_first.encode("abc")) == Pieces{"a", "bc"});
  const Tokenizer ab_first(tiny_vocab({{"a", "b"}, {"b", "c"}}));
  CHECK(token_pieces(ab_first, ab_first.encode("abc")) == Pieces{"ab", "c"});

  // Merges never cross pre-token boundaries: "o" and " w" are different words.
  const Tokenizer cross(tiny_vocab({{"o", "Ġ"}}));
  CHECK(token_pieces(cross, cross.encode("o w")) == Pieces{"o", " ", "w"});
}

TEST_CASE("Special tokens are split out first, longest match first", "[unit]") {
  const Tokenizer tok(tiny_vocab(kWordMerges));
  CHECK(tok.encode("<|im_start|>hello<|im_end|>") ==
        std::vector<int32_t>{1, tok.find_token("hello"), 2});
  CHECK(tok.encode("<|im_start|>xhello")[0] == 3);  // "<|im_start|>x" beats "<|im_start|>"
  CHECK(tok.encode("a<|im_end|><|im_end|>b") ==
        std::vector<int32_t>{byte_id('a'), 2, 2, byte_id('b')});
  CHECK(tok.encode("<|im_end") == std::vector<int32_t>{byte_id('<'), byte_id('|'), byte_id('i'),
                                                       byte_id('m'), byte_id('_'), byte_id('e'),
                                                       byte_id('n'), byte_id('d')});

  // Without parse_special, control tokens are plain text; user-defined ones still split.
  const std::vector<int32_t> plain = tok.encode("<|im_end|><tool>", false);
  CHECK(std::find(plain.begin(), plain.end(), 2) == plain.end());
  CHECK(plain.back() == 4);
  CHECK(tok.decode(plain) == "<|im_end|><tool>");

  // Text around a special token is pre-tokenized on its own: " hello" keeps its space.
  CHECK(token_pieces(tok, tok.encode("<|im_start|> hello")) ==
        Pieces{"<|im_start|>", " ", "hello"});
}

TEST_CASE("BOS is prepended when the vocab asks for it", "[unit]") {
  VocabData v = tiny_vocab(kWordMerges);
  v.add_bos = true;
  const Tokenizer tok(std::move(v));
  CHECK(tok.encode("hello") == std::vector<int32_t>{0, tok.find_token("hello")});
  CHECK(tok.encode("") == std::vector<int32_t>{0});
  CHECK(tok.bos_id() == 0);
  CHECK(tok.eos_id() == 2);
  CHECK(tok.is_control(2));
  CHECK_FALSE(tok.is_control(4));
  CHECK_FALSE(tok.is_control(byte_id('a')));
  CHECK(tok.decode({0, tok.find_token("hello"), 2}) == "<|endoftext|>hello<|im_end|>");
  // A text that already begins with BOS (a rendered Llama-3 chat) does not get a second one,
  // unless special tokens are not parsed, when the BOS text is only text.
  CHECK(tok.encode("<|endoftext|>hello") == std::vector<int32_t>{0, tok.find_token("hello")});
  CHECK(tok.encode("<|endoftext|>hello", false).front() == 0);
  CHECK(tok.encode("<|endoftext|>hello", false).size() > 2);
}

TEST_CASE("GPT-2 pre-tokenizer splits", "[unit]") {
  CHECK(pre_tokenize("gpt2", "Hello world") == Pieces{"Hello", " world"});
  CHECK(pre_tokenize("gpt2", "I'll go, we're 'S") ==
        Pieces{"I", "'ll", " go", ",", " we", "'re", " '", "S"});
  CHECK(pre_tokenize("gpt2", "a   b") == Pieces{"a", "  ", " b"});
  CHECK(pre_tokenize("gpt2", "x\n\n\ny") == Pieces{"x", "\n\n", "\n", "y"});
  CHECK(pre_tokenize("gpt2", "123 4567") == Pieces{"123", " 4567"});
  CHECK(pre_tokenize("gpt2", "trailing  ") == Pieces{"trailing", "  "});
  CHECK(pre_tokenize("gpt2", "😀😀 ok") == Pieces{"😀😀", " ok"});
  CHECK(pre_tokenize("gpt2", "\tif x:\n\t\treturn") ==
        Pieces{"\t", "if", " x", ":", "\n\t", "\t", "return"});
  CHECK(pre_tokenize("gpt-2", "café naïve") == Pieces{"café", " naïve"});
  CHECK(pre_tokenize("gpt2", "").empty());
}

TEST_CASE("SmolLM pre-tokenizer splits every digit before the GPT-2 rules", "[unit]") {
  CHECK(pre_tokenize("smollm", "abc 123") == Pieces{"abc", " ", "1", "2", "3"});
  CHECK(pre_tokenize("smollm", "x 12 y") == Pieces{"x", " ", "1", "2", " y"});
  // The whitespace look-ahead stops at the digit's chunk boundary.
  CHECK(pre_tokenize("smollm", "  1") == Pieces{"  ", "1"});
  CHECK(pre_tokenize("smollm", "3.14") == Pieces{"3", ".", "1", "4"});
  CHECK(pre_tokenize("smollm", "v2 ²") == Pieces{"v", "2", " ", "²"});
  CHECK(pre_tokenize("smollm", "family 👨‍👩‍👧") ==
        Pieces{"family", " 👨‍👩‍👧"});
}

TEST_CASE("Llama-3 pre-tokenizer splits", "[unit]") {
  CHECK(pre_tokenize("llama3", "Hello world") == Pieces{"Hello", " world"});
  CHECK(pre_tokenize("llama3", "I'LL go don't") == Pieces{"I", "'LL", " go", " don", "'t"});
  CHECK(pre_tokenize("llama3", "1234567") == Pieces{"123", "456", "7"});
  CHECK(pre_tokenize("llama3", "a\n\nb") == Pieces{"a", "\n\n", "b"});
  CHECK(pre_tokenize("llama3", "x  \n  y") == Pieces{"x", "  \n", " ", " y"});
  CHECK(pre_tokenize("llama3", "!!\n\nx") == Pieces{"!!\n\n", "x"});
  CHECK(pre_tokenize("llama3", "$$$ x") == Pieces{"$$$", " x"});
  CHECK(pre_tokenize("llama-bpe", "  word") == Pieces{" ", " word"});
}

TEST_CASE("Qwen2 pre-tokenizer: Llama-3's rules with every digit alone", "[unit]") {
  CHECK(pre_tokenize("qwen2", "1234567") == Pieces{"1", "2", "3", "4", "5", "6", "7"});
  CHECK(pre_tokenize("qwen2", "abc 12345") == Pieces{"abc", " ", "1", "2", "3", "4", "5"});
  CHECK(pre_tokenize("qwen2", "v2.5x") == Pieces{"v", "2", ".", "5", "x"});
  CHECK(pre_tokenize("qwen2", "I'LL go don't") == Pieces{"I", "'LL", " go", " don", "'t"});
  CHECK(pre_tokenize("qwen2", "x  \n  y") == Pieces{"x", "  \n", " ", " y"});
  CHECK(pre_tokenize("qwen2", "key-9f3a") == Pieces{"key", "-", "9", "f", "3", "a"});
  CHECK(pre_tokenize("qwen2", "}\n\n    return") == Pieces{"}\n\n", "   ", " return"});

  // Digits next to contractions, symbols and newline runs: each case splits otherwise under
  // Llama-3's \p{N}{1,3}, which keeps up to three digits together.
  const std::vector<std::pair<std::string, Pieces>> digit_cases = {
      {"I'm 25\n\n", {"I", "'m", " ", "2", "5", "\n\n"}},
      {"DON'T 99", {"DON", "'T", " ", "9", "9"}},
      {"x=10\n\n\ny", {"x", "=", "1", "0", "\n\n\n", "y"}},
      {"3.14159", {"3", ".", "1", "4", "1", "5", "9"}},
      {"id-2024\r\n", {"id", "-", "2", "0", "2", "4", "\r\n"}},
      {"１０ ２０", {"１", "０", " ", "２", "０"}},  // fullwidth digits are \p{N} too
      {"x²³", {"x", "²", "³"}},
  };
  for (const auto& [text, pieces] : digit_cases) {
    INFO("text: " << text);
    CHECK(pre_tokenize("qwen2", text) == pieces);
    CHECK(pre_tokenize("llama3", text) != pieces);
  }

  // Every name llama.cpp gives this regex.
  for (const char* alias :
       {"deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"}) {
    INFO("pre: " << alias);
    CHECK(pre_tokenize(alias, "I'm 25\n\n") == pre_tokenize("qwen2", "I'm 25\n\n"));
  }
}

TEST_CASE("Default pre-tokenizer splits punctuation and digit triples", "[unit]") {
  CHECK(pre_tokenize("default", "a+b=c") == Pieces{"a", "+", "b", "=", "c"});
  CHECK(pre_tokenize("default", "12345") == Pieces{"123", "45"});
  CHECK(pre_tokenize("default", "hello, world") == Pieces{"hello", ",", " world"});
  CHECK(pre_tokenize("default", " 123") == Pieces{" ", "123"});
  CHECK(pre_tokenize("default", "x...y!?") == Pieces{"x", "...", "y", "!?"});
}

TEST_CASE("Unsupported pre-tokenizers are input errors", "[unit]") {
  CHECK_THROWS_AS(pre_tokenize("bogus", "x"), InputError);
  CHECK_THROWS_WITH(Tokenizer(tiny_vocab({}, "bogus")), Catch::Contains("bogus"));
}

TEST_CASE("decode(encode(s)) == s for Unicode, emoji, code and whitespace", "[unit]") {
  const std::vector<std::string> texts = {
      "",
      "hello world",
      "  leading and trailing  ",
      "\n\n\n",
      "tabs\tand\r\nCRLF\n",
      "def f(x):\n    return x ** 2  # comment\n",
      "café 日本語 مرحبا Привет",
      "emoji 😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵",
      "numbers 1234567 3.14 ١٢٣",
      "'ll 're 'S don't",
      "<|im_start|>user\nhi<|im_end|>\n",
      std::string("nul\0byte", 8),
  };
  for (const char* pre : {"gpt2", "smollm", "llama3", "qwen2", "default"}) {
    const Tokenizer tok(tiny_vocab(kWordMerges, pre));
    for (const std::string& s : texts) {
      INFO("pre " << pre << ", text: " << s);
      CHECK(tok.decode(tok.encode(s)) == s);
      CHECK(tok.decode(tok.encode(s, false)) == s);
    }
  }
}

TEST_CASE("Invalid UTF-8 never crashes and reads as U+FFFD per bad byte", "[unit]") {
  const Tokenizer tok(tiny_vocab(kWordMerges, "smollm"));
  CHECK(tok.decode(tok.encode("bad \xff byte")) == "bad \xEF\xBF\xBD byte");
  CHECK(tok.decode(tok.encode("cut \xe6\x97")) == "cut \xEF\xBF\xBD\xEF\xBF\xBD");
  CHECK(tok.decode(tok.encode("\x80")) == "\xEF\xBF\xBD");

  uint32_t state = 12345;
  auto next_byte = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<char>(state >> 24);
  };
  for (const char* pre : {"gpt2", "smollm", "llama3", "qwen2", "default"}) {
    const Tokenizer fuzz(tiny_vocab(kWordMerges, pre));
    for (int i = 0; i < 300; ++i) {
      std::string s;
      const int n = 1 + i % 40;
      for (int k = 0; k < n; ++k) s += next_byte();
      const std::vector<int32_t> ids = fuzz.encode(s);
      for (int32_t id : ids) REQUIRE((id >= 0 && id < fuzz.vocab_size()));
      // Valid UTF-8 in the output: every code point decodes without the invalid flag.
      for (uint32_t cp : utf8_to_code_points(fuzz.decode(ids)))
        REQUIRE((cp & kInvalidByteFlag) == 0);
    }
  }
}

TEST_CASE("Symbols that are not tokens fall back to single-byte tokens", "[unit]") {
  // A merge whose result is missing from the vocab: llama.cpp keeps the pieces' bytes that are
  // tokens themselves ("a" and "b" are) and drops the rest.
  VocabData v = tiny_vocab({});
  v.merges.push_back("a b");
  const Tokenizer tok(std::move(v));
  CHECK(tok.encode("ab") == std::vector<int32_t>{byte_id('a'), byte_id('b')});
  CHECK(tok.encode("abc") == std::vector<int32_t>{byte_id('a'), byte_id('b'), byte_id('c')});
}

TEST_CASE("Unicode classes follow llama.cpp", "[unit]") {
  CHECK(is_letter('a'));
  CHECK(is_letter(0x65E5));  // 日
  CHECK(is_number('7'));
  CHECK(is_number(0x0663));  // Arabic-Indic three
  CHECK(is_number(0x00B2));  // superscript two (No)
  CHECK(is_punctuation('!'));
  CHECK(is_punctuation(0x3002));     // ideographic full stop
  CHECK_FALSE(is_punctuation('$'));  // Sc
  CHECK(is_whitespace(' '));
  CHECK(is_whitespace(0x3000));
  CHECK(is_whitespace(0x0085));
  CHECK_FALSE(is_whitespace(0x001C));  // Python's isspace says yes; White_Space says no
  CHECK_FALSE(is_whitespace(0x200B));  // zero width space is Cf
  CHECK(code_point_class(0x1F600) == CodePointClass::Other);
  CHECK(code_point_class(0x2EBF0) == CodePointClass::Letter);  // CJK extension I (15.1)
  CHECK(code_point_class(0x110000) == CodePointClass::Other);

  CHECK(utf8_to_code_points("a\xC3\xA9") == std::vector<uint32_t>{'a', 0xE9});
  CHECK(utf8_to_code_points("\xF0\x9F\x98\x80") == std::vector<uint32_t>{0x1F600});
  CHECK(utf8_to_code_points("\xC0\xAF") == std::vector<uint32_t>{0x2F});  // overlong, accepted
  CHECK(utf8_to_code_points("\xFF\xE6\x97") == std::vector<uint32_t>{kInvalidByteFlag | 0xFF,
                                                                     kInvalidByteFlag | 0xE6,
                                                                     kInvalidByteFlag | 0x97});
  std::string back;
  for (uint32_t cp : utf8_to_code_points("x\xFFy\xE6")) append_utf8(cp, back);
  CHECK(back == "x\xFFy\xE6");
  CHECK(token_char_to_byte(0x120) == ' ');  // Ġ
  CHECK(byte_to_token_char('\n') == "Ċ");
}

TEST_CASE("from_gguf reads the tokenizer keys and names the file on errors", "[unit]") {
  using namespace kvbench::testing;
  const VocabData v = tiny_vocab(kWordMerges, "smollm");
  std::vector<int64_t> types;
  for (TokenType t : v.token_types) types.push_back(static_cast<int64_t>(t));
  auto write = [&](const std::string& name, const std::string& model, const std::string& pre) {
    GgufWriter w;
    w.add("tokenizer.ggml.model", gguf_str(model));
    w.add("tokenizer.ggml.pre", gguf_str(pre));
    w.add("tokenizer.ggml.tokens", gguf_array(v.tokens));
    w.add("tokenizer.ggml.token_type", gguf_array(GgufValueType::INT32, types));
    w.add("tokenizer.ggml.merges", gguf_array(v.merges));
    w.add("tokenizer.ggml.bos_token_id", gguf_u32(0));
    w.add("tokenizer.ggml.eos_token_id", gguf_u32(2));
    w.add("tokenizer.ggml.add_bos_token", gguf_bool(true));
    const std::string path = temp_path(name);
    w.write(path);
    return path;
  };

  const GgufFile good(write("tok_good.gguf", "gpt2", "smollm"));
  const Tokenizer tok = Tokenizer::from_gguf(good);
  CHECK(tok.vocab_size() == static_cast<int32_t>(v.tokens.size()));
  CHECK(tok.encode("<|im_start|>hello 12") == std::vector<int32_t>{0, 1, tok.find_token("hello"),
                                                                   byte_id(' '), byte_id('1'),
                                                                   byte_id('2')});

  const std::string llama_path = write("tok_spm.gguf", "llama", "default");
  const GgufFile spm(llama_path);
  CHECK_THROWS_AS(Tokenizer::from_gguf(spm), InputError);
  CHECK_THROWS_WITH(Tokenizer::from_gguf(spm),
                    Catch::Contains(llama_path) && Catch::Contains("gpt2"));

  const std::string bogus_path = write("tok_pre.gguf", "gpt2", "no-such-pre");
  const GgufFile bogus(bogus_path);
  CHECK_THROWS_WITH(Tokenizer::from_gguf(bogus),
                    Catch::Contains(bogus_path) && Catch::Contains("no-such-pre"));
}

}  // namespace
}  // namespace kvbench
