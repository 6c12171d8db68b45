// The real SmolLM2 tokenizer against llama.cpp's ids (tests/fixtures/tokenizer_smollm2.json,
// written by scripts/make_tokenizer_fixtures.py). Exits 77 (skipped) without the model.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/model/chat_template.h"
#include "harness/model/gguf.h"
#include "harness/model/tokenizer.h"
#include "tokenizer_fixture.h"

namespace kvbench {
namespace {

std::string model_path_or_skip() {
  const char* env = std::getenv("KVBENCH_MODEL");
  std::string path;
  if (env && *env) {
    path = env;
  } else {
#if defined(KVBENCH_DEFAULT_MODEL_PATH)
    path = KVBENCH_DEFAULT_MODEL_PATH;
#else
    path = std::string(KVBENCH_FIXTURES) + "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf";
#endif
  }
  if (!std::filesystem::exists(path)) {
    std::printf("model not found at %s (set KVBENCH_MODEL or run ./scripts/setup.sh): skipped\n",
                path.c_str());
    std::exit(77);
  }
  return path;
}

const GgufFile& model_file() {
  static const GgufFile file(model_path_or_skip());
  return file;
}

const Tokenizer& smollm2() {
  static const Tokenizer tokenizer = Tokenizer::from_gguf(model_file());
  return tokenizer;
}

// The same vocab under another pre-tokenizer, as the fixture script's metadata-only copies.
Tokenizer with_pre(const std::string& pre) {
  VocabData vocab = Tokenizer::read_vocab(model_file());
  vocab.pre = pre;
  return Tokenizer(std::move(vocab));
}

struct Case {
  std::string text;
  bool valid_utf8;
  nlohmann::json ids;
};

std::vector<Case> fixture_cases() {
  std::ifstream in(std::string(KVBENCH_FIXTURES) + "/tokenizer_smollm2.json");
  REQUIRE(in);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& c : doc.at("cases")) {
    Case out;
    out.valid_utf8 = c.contains("text");
    out.text = testing::tokenizer_fixture_text(c);
    out.ids = c;
    cases.push_back(std::move(out));
  }
  REQUIRE(cases.size() >= 40);
  return cases;
}

std::vector<int32_t> ids_of(const nlohmann::json& c, const char* key) {
  return c.at(key).get<std::vector<int32_t>>();
}

TEST_CASE("SmolLM2 tokenizer gives llama.cpp's ids on every fixture string", "[model]") {
  const Tokenizer& tok = smollm2();
  CHECK(tok.vocab_size() == 49152);
  CHECK(tok.bos_id() == 1);
  CHECK(tok.eos_id() == 2);
  CHECK(tok.is_control(tok.find_token("<|im_end|>")));
  for (const Case& c : fixture_cases()) {
    INFO("text: " << c.text);
    CHECK(tok.encode(c.text) == ids_of(c.ids, "ids"));
    CHECK(tok.encode(c.text, false) == ids_of(c.ids, "ids_no_special"));
    if (c.valid_utf8) CHECK(tok.decode(tok.encode(c.text)) == c.text);
  }
}

TEST_CASE("Other pre-tokenizers on the SmolLM2 vocab give llama.cpp's ids", "[model]") {
  const auto cases = fixture_cases();
  for (const auto& [key, pre] : {std::pair<const char*, const char*>{"ids_gpt2", "gpt-2"},
                                 {"ids_llama3", "llama-bpe"},
                                 {"ids_default", "default"}}) {
    const Tokenizer tok = with_pre(pre);
    for (const Case& c : cases) {
      INFO("pre: " << pre << ", text: " << c.text);
      CHECK(tok.encode(c.text) == ids_of(c.ids, key));
    }
  }
}

TEST_CASE("A rendered ChatML prompt tokenizes with its control tokens", "[model]") {
  const Tokenizer& tok = smollm2();
  const std::string prompt =
      render_chat(ChatFormat::ChatML, {{"user", "Hi"}}, true, "You are a helpful assistant.");
  const std::vector<int32_t> ids = tok.encode(prompt);
  const int32_t im_start = tok.find_token("<|im_start|>");
  const int32_t im_end = tok.find_token(end_of_turn_token(ChatFormat::ChatML));
  REQUIRE(ids.size() > 6);
  CHECK(ids.front() == im_start);
  CHECK(std::count(ids.begin(), ids.end(), im_start) == 3);
  CHECK(std::count(ids.begin(), ids.end(), im_end) == 2);
  CHECK(tok.decode(ids) == prompt);
}

TEST_CASE("Encoding a 10K-token text takes well under 100 ms", "[model]") {
  const Tokenizer& tok = smollm2();
  std::string text;
  for (int i = 0; text.size() < 48000; ++i) {
    text += "Paragraph " + std::to_string(i) +
            ": The KV cache keeps keys and values for every past token; "
            "eviction methods such as SnapKV or H2O drop the ones attention ignores.\n"
            "    def evict(cache, budget):\n\treturn cache[-budget:]  # naïve café 日本語 😀\n";
  }
  double best_ms = 1e9;
  size_t n_tokens = 0;
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    n_tokens = tok.encode(text).size();
    const auto t1 = std::chrono::steady_clock::now();
    best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  WARN("encode: " << n_tokens << " tokens in " << best_ms << " ms ("
                  << static_cast<int64_t>(n_tokens / (best_ms / 1000.0)) << " tokens/s)");
  CHECK(n_tokens >= 10000);
  CHECK(best_ms < 100.0);
}

}  // namespace
}  // namespace kvbench
