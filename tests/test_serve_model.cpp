// `kvbench serve` on the real model, where a model really ends its answers: ignore_eos runs
// an answer past the end of its turn and says where that end was (eos_text_bytes), the text
// `kvbench load --ignore-eos` scores.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "model_path.h"
#include "serve_process.h"

using kvbench::testing::post;
using kvbench::testing::Reply;
using kvbench::testing::ServerProcess;
using nlohmann::json;

TEST_CASE("serve model: ignore_eos answers past the end of turn and says where it was", "[model]") {
  ServerProcess server(kvbench::testing::model_path_or_skip(), {});
  const json messages = json::array(
      {{{"role", "user"}, {"content", "What is the capital of France? Answer in one word."}}});
  const Reply natural =
      post(server.port, "/v1/chat/completions",
           json{{"messages", messages}, {"max_tokens", 48}, {"temperature", 0}}.dump());
  INFO(natural.body);
  REQUIRE(natural.status == 200);
  const json a = json::parse(natural.body);
  REQUIRE(a["choices"][0]["finish_reason"] == "stop");  // the model ended its turn
  const std::string text = a["choices"][0]["message"]["content"];
  CHECK_FALSE(a["kvbench"].contains("eos_text_bytes"));  // not asked to run past it

  const int64_t tokens = a["usage"]["completion_tokens"];
  const Reply forced = post(server.port, "/v1/chat/completions",
                            json{{"messages", messages},
                                 {"max_tokens", tokens + 12},
                                 {"temperature", 0},
                                 {"ignore_eos", true}}
                                .dump());
  INFO(forced.body);
  REQUIRE(forced.status == 200);
  const json b = json::parse(forced.body);
  CHECK(b["choices"][0]["finish_reason"] == "length");
  CHECK(b["usage"]["completion_tokens"] == tokens + 12);
  const std::string longer = b["choices"][0]["message"]["content"];
  CHECK(longer.size() > text.size());
  CHECK(longer.compare(0, text.size(), text) == 0);  // greedy: the same answer, then more
  REQUIRE(b["kvbench"].contains("eos_text_bytes"));
  CHECK(b["kvbench"]["eos_text_bytes"] == text.size());
}
