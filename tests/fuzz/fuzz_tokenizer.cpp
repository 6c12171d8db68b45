// The tokenizer on arbitrary bytes, with each pre-tokenizer kvbench supports, over the tiny
// byte-level vocabulary of the unit tests: ids are in range, and valid UTF-8 text decodes
// back to itself.
#include <cstdint>
#include <string>

#include "../gguf_writer.h"
#include "fuzz_check.h"
#include "harness/model/tokenizer.h"
#include "harness/model/unicode.h"

using namespace kvbench;

namespace {

const Tokenizer& tokenizer_for(uint8_t selector) {
  static const char* const kPre[] = {"default", "gpt2", "smollm", "llama3", "qwen2"};
  static std::vector<Tokenizer> tokenizers = [] {
    std::vector<Tokenizer> out;
    for (const char* pre : kPre) {
      VocabData vocab;
      vocab.tokens = testing::tiny_llama_tokens();
      vocab.merges = testing::tiny_llama_merges();
      vocab.token_types.assign(vocab.tokens.size(), TokenType::NORMAL);
      for (int i = 0; i < testing::kTinyLlamaByteTokenBase; ++i) {
        vocab.token_types[i] = TokenType::CONTROL;
      }
      vocab.pre = pre;
      out.emplace_back(vocab);
    }
    return out;
  }();
  return tokenizers[selector % tokenizers.size()];
}

// Strictly valid: llama.cpp's decoder (and kvbench's) also reads overlong forms, which
// encode back shorter, so only text that re-encodes to itself must round-trip.
bool valid_utf8(const std::string& text) {
  std::string again;
  for (uint32_t cp : utf8_to_code_points(text)) {
    if (cp & kInvalidByteFlag) return false;
    append_utf8(cp, again);
  }
  return again == text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Tokenizer& tokenizer = tokenizer_for(data[0]);
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  for (const bool special : {false, true}) {
    const std::vector<int32_t> ids = tokenizer.encode(text, special);
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size());
    if (!special && valid_utf8(text)) FUZZ_CHECK(tokenizer.decode(ids) == text);
  }
  return 0;
}
