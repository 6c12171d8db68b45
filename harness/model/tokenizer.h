// GPT-2 style byte-level BPE tokenizer built from GGUF metadata (tokenizer.ggml.*).
// Matches llama.cpp's llm_tokenizer_bpe: special tokens are split out first, the rest is
// pre-tokenized by the model's regex (chosen by tokenizer.ggml.pre), bytes are mapped to
// the GPT-2 printable alphabet, and merges are applied by rank.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvbench {

class GgufFile;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  UNDEFINED = 0,
  NORMAL = 1,
  UNKNOWN = 2,
  CONTROL = 3,
  USER_DEFINED = 4,
  UNUSED = 5,
  BYTE = 6,
};

struct VocabData {
  std::vector<std::string> tokens;     // id -> token text (byte-level alphabet)
  std::vector<TokenType> token_types;  // id -> type; empty means all NORMAL
  std::vector<std::string> merges;     // "left right", in rank order
  std::string pre = "default";         // pre-tokenizer name (tokenizer.ggml.pre)
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;
};

class Tokenizer {
 public:
  explicit Tokenizer(VocabData vocab);  // throws InputError on an unsupported pre-tokenizer
  static Tokenizer from_gguf(const GgufFile& file);  // throws InputError naming the file
  // The tokenizer.ggml.* keys alone (from_gguf without building); InputError naming the file.
  static VocabData read_vocab(const GgufFile& file);

  // parse_special: text such as "<|im_start|>" becomes its control token, as llama.cpp does
  // with parse_special=true. BOS is prepended when the vocab asks for it (add_bos) and the
  // text does not already begin with it.
  std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string token_text(int32_t id) const;  // decoded bytes of one token (may be partial UTF-8)

  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t bos_id() const { return vocab_.bos_id; }
  int32_t eos_id() const { return vocab_.eos_id; }
  int32_t find_token(const std::string& text) const;  // exact token text, -1 if none
  // CONTROL tokens end generation / never print.
  bool is_control(int32_t id) const;

 private:
  // A merge of two adjacent symbols. Symbols are token ids, or ids from vocab_size() up for
  // merge pieces that are not tokens (text in extra_symbols_).
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  VocabData vocab_;
  std::vector<uint8_t> pre_steps_;  // pre-tokenizer split steps, in order
  bool ignore_merges_ = false;      // llama3: a pre-token that is a whole token skips BPE
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> merge
  std::vector<std::string> extra_symbols_;
  int32_t byte_symbol_[256];                 // symbol of each byte's alphabet char, -1 if none
  std::vector<std::string> special_tokens_;  // CONTROL, USER_DEFINED, UNKNOWN: longest first
  std::vector<int32_t> special_ids_;
  void encode_text(const std::string& text, std::vector<int32_t>& out) const;
  void bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  void emit_symbol(int32_t symbol, uint8_t byte, std::vector<int32_t>& out) const;
};

// Splits text into pre-tokens with the regex set llama.cpp uses for `pre`
// ("default"/"gpt2", "smollm", "llama3", "qwen2", ...). Exposed for tests.
std::vector<std::string> pre_tokenize(const std::string& pre, const std::string& text);

}  // namespace kvbench
