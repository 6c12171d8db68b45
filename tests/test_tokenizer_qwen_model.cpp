// The real Qwen2.5-Coder-0.5B-Instruct tokenizer and chat template against llama.cpp
// (tests/fixtures/tokenizer_qwen2.json, written by scripts/make_tokenizer_fixtures.py).
// Each test exits 77 (skipped) when the Qwen GGUF is absent.
#include <catch2/catch.hpp>
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
#include "model_path.h"
#include "tokenizer_fixture.h"

namespace kvbench {
namespace {

const char* kQwenSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

const GgufFile& qwen_file() {
  static const GgufFile file(testing::qwen_model_path_or_skip());
  return file;
}

const Tokenizer& qwen() {
  static const Tokenizer tokenizer = Tokenizer::from_gguf(qwen_file());
  return tokenizer;
}

const nlohmann::json& fixture() {
  static const nlohmann::json doc = [] {
    std::ifstream in(std::string(KVBENCH_FIXTURES) + "/tokenizer_qwen2.json");
    REQUIRE(in);
    return nlohmann::json::parse(in);
  }();
  return doc;
}

struct Case {
  std::string text;
  bool valid_utf8;
  const nlohmann::json* ids;
};

std::vector<Case> fixture_cases() {
  std::vector<Case> cases;
  for (const auto& c : fixture().at("cases")) {
    Case out{"", c.contains("text"), &c};
    out.text = testing::tokenizer_fixture_text(c);
    cases.push_back(std::move(out));
  }
  REQUIRE(cases.size() >= 100);
  return cases;
}

std::vector<int32_t> ids_of(const Case& c, const char* key) {
  return c.ids->at(key).get<std::vector<int32_t>>();
}

TEST_CASE("Qwen2.5 tokenizer gives llama.cpp's ids on every fixture string", "[model]") {
  const Tokenizer& tok = qwen();
  CHECK(tok.vocab_size() == 151936);
  CHECK(tok.bos_id() == 151643);
  CHECK(tok.eos_id() == 151645);
  CHECK(tok.encode("").empty());  // add_bos_token is false
  size_t n_tokens = 0;
  for (const Case& c : fixture_cases()) {
    INFO("text: " << c.text);
    const std::vector<int32_t> ids = tok.encode(c.text);
    CHECK(ids == ids_of(c, "ids"));
    CHECK(tok.encode(c.text, false) == ids_of(c, "ids_no_special"));
    if (c.valid_utf8) CHECK(tok.decode(ids) == c.text);
    n_tokens += ids.size();
  }
  CHECK(n_tokens >= 2000);
}

TEST_CASE("Llama-3's pre-tokenizer on the Qwen2.5 vocab gives llama.cpp's ids", "[model]") {
  VocabData vocab = Tokenizer::read_vocab(qwen_file());
  vocab.pre = "llama-bpe";
  const Tokenizer llama3(std::move(vocab));
  size_t differ = 0;
  for (const Case& c : fixture_cases()) {
    INFO("text: " << c.text);
    CHECK(llama3.encode(c.text) == ids_of(c, "ids_llama3"));
    differ += ids_of(c, "ids_llama3") != ids_of(c, "ids");
  }
  // The vocab's multi-digit tokens ("１０", "２０") tell \p{N} from \p{N}{1,3} apart, so a
  // qwen2 splitter that kept digits together would fail the test above.
  CHECK(differ >= 2);
}

TEST_CASE("Qwen2.5's control and user-defined tokens split out as llama.cpp's", "[model]") {
  const Tokenizer& tok = qwen();
  // 20 CONTROL tokens from 151643, then <tool_call> and </tool_call> (USER_DEFINED), then
  // [PAD...] tokens (UNUSED: plain text).
  for (int32_t id = 151643; id <= 151664; ++id) {
    const std::string text = tok.token_text(id);
    INFO("token " << id << " " << text);
    CHECK(tok.find_token(text) == id);
    CHECK(tok.encode(text) == std::vector<int32_t>{id});
    CHECK(tok.encode("a" + text + "b").size() == 3);
    const bool user_defined = text == "<tool_call>" || text == "</tool_call>";
    CHECK(tok.is_control(id) == !user_defined);
    // Without parse_special only user-defined tokens are still split out.
    CHECK((tok.encode(text, false) == std::vector<int32_t>{id}) == user_defined);
  }
  CHECK(tok.encode("[PAD151665]").size() > 1);
  CHECK_FALSE(tok.is_control(tok.find_token("Hello")));

  // Generation stops at the end-of-turn token the ChatML template writes, which is also EOS.
  const int32_t im_end = tok.find_token(end_of_turn_token(ChatFormat::ChatML));
  CHECK(im_end == tok.eos_id());
  CHECK(tok.is_control(im_end));
}

TEST_CASE("Qwen2.5's chat template: its default system prompt is found and rendered as its Jinja",
          "[model]") {
  const std::string jinja = qwen_file().get_string("tokenizer.chat_template", "");
  REQUIRE(!jinja.empty());
  CHECK(detect_chat_format(jinja) == ChatFormat::ChatML);
  const std::string system = default_system_prompt(jinja);
  CHECK(system == kQwenSystem);
  const auto& chats = fixture().at("chats");
  REQUIRE(chats.size() >= 3);
  for (const auto& chat : chats) {
    std::vector<ChatMessage> messages;
    for (const auto& m : chat.at("messages")) {
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    const std::string expected = chat.at("text").get<std::string>();
    INFO("llama-cpp-python's rendering: " << expected);
    const std::string rendered = render_chat(ChatFormat::ChatML, messages,
                                             chat.at("add_generation_prompt").get<bool>(), system);
    CHECK(rendered == expected);
    CHECK(qwen().encode(rendered) == chat.at("ids").get<std::vector<int32_t>>());
  }
}

}  // namespace
}  // namespace kvbench
