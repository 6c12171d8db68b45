// SCBench's JSONL schema: what loads, and one InputError naming file:line for each way a
// file can be wrong.
#include <catch2/catch.hpp>

#include <string>

#include "datasets/sample.h"
#include "gguf_writer.h"
#include "common/input_error.h"

using namespace kvbench;

namespace {

std::string write_jsonl(const std::string& name, const std::string& text) {
  const std::string path = testing::temp_path(name);
  testing::write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
  return path;
}

// Loading `text` fails with a message that names `where` (file:line) and contains `what`.
void require_error(const std::string& text, int line, const std::string& what) {
  const std::string path = write_jsonl("bad.jsonl", text);
  const std::string where = line > 0 ? path + ":" + std::to_string(line) + ": " : path + ": ";
  try {
    load_samples_jsonl(path);
    FAIL("no error for: " << text);
  } catch (const InputError& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.rfind(where, 0) == 0);
    CHECK(message.find(what) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
}

const char* kTurn = R"({"input": "q", "answer": "a"})";

std::string row(const std::string& id, const std::string& turns) {
  return R"({"id": )" + id + R"(, "context": "ctx", "multi_turns": )" + turns + "}";
}

}  // namespace

TEST_CASE("jsonl: string, number and list answers, numeric and string ids", "[unit]") {
  const std::string text =
      R"({"id": 7, "context": "The list.", "multi_turns": [{"input": "first?", "answer": "one"}, {"input": "second?", "answer": 42}, {"input": "third?", "answer": ["x", "y"], "extra": true}], "length": 12})"
      "\n\n   \n"
      R"({"id": "s-2", "context": "", "multi_turns": [{"input": "pi?", "answer": 3.5}, {"input": "n?", "answer": [1, "two"]}]})"
      "\r\n";
  const auto samples = load_samples_jsonl(write_jsonl("good.jsonl", text));
  REQUIRE(samples.size() == 2);
  CHECK(samples[0].id == "7");
  CHECK(samples[0].context == "The list.");
  REQUIRE(samples[0].turns.size() == 3);
  CHECK(samples[0].turns[0].input == "first?");
  CHECK(samples[0].turns[0].answers == std::vector<std::string>{"one"});
  CHECK(samples[0].turns[1].answers == std::vector<std::string>{"42"});
  CHECK(samples[0].turns[2].answers == std::vector<std::string>{"x", "y"});
  CHECK(samples[1].id == "s-2");
  CHECK(samples[1].context.empty());
  CHECK(samples[1].turns[0].answers == std::vector<std::string>{"3.5"});
  CHECK(samples[1].turns[1].answers == std::vector<std::string>{"1", "two"});
}

TEST_CASE("jsonl: unicode text and escapes survive", "[unit]") {
  const auto samples = load_samples_jsonl(write_jsonl(
      "unicode.jsonl",
      "\xEF\xBB\xBF" R"({"id": 1.0, "context": "caf\u00e9 \"q\"\n\u4e2d", "multi_turns": [{"input": "\u00fc", "answer": "\ud83d\ude00"}]})"));
  REQUIRE(samples.size() == 1);
  CHECK(samples[0].id == "1");
  CHECK(samples[0].context == "caf\xC3\xA9 \"q\"\n\xE4\xB8\xAD");
  CHECK(samples[0].turns[0].input == "\xC3\xBC");
  CHECK(samples[0].turns[0].answers[0] == "\xF0\x9F\x98\x80");
}

TEST_CASE("jsonl: a missing file, an empty file", "[unit]") {
  const std::string missing = testing::temp_path("absent.jsonl");
  CHECK_THROWS_WITH(load_samples_jsonl(missing), Catch::Contains(missing) &&
                                                     Catch::Contains("cannot open"));
  require_error("", 0, "no samples");
  require_error("\n  \n\n", 0, "no samples");
}

TEST_CASE("jsonl: malformed lines are named by file:line", "[unit]") {
  const std::string good = row("1", std::string("[") + kTurn + "]") + "\n";
  require_error(good + "{\"id\": 2, \"context\": \"x\"\n", 2, "malformed JSON");
  require_error(good + "\n" + "not json\n", 3, "malformed JSON");
  require_error("[1, 2]\n", 1, "expected a JSON object, got a list");
  require_error(good + good, 2, "duplicate id '1' (first on line 1)");
}

TEST_CASE("jsonl: missing and mistyped fields are named", "[unit]") {
  const std::string turns = std::string("[") + kTurn + "]";
  require_error(R"({"context": "c", "multi_turns": )" + turns + "}", 1, "missing field 'id'");
  require_error(row("true", turns), 1, "field 'id' must be a string or a number, not a boolean");
  require_error(R"({"id": 1, "multi_turns": )" + turns + "}", 1, "missing field 'context'");
  require_error(R"({"id": 1, "context": 5, "multi_turns": )" + turns + "}", 1,
                "field 'context' must be a string, not a number");
  require_error(R"({"id": 1, "context": "c"})", 1, "missing field 'multi_turns'");
  require_error(row("1", R"({"input": "q"})"), 1, "field 'multi_turns' must be a list");
  require_error(row("1", "[]"), 1, "field 'multi_turns' is an empty list");
  require_error(row("1", R"([{"input": "q", "answer": "a"}, "oops"])"), 1,
                "multi_turns[1]: expected an object");
  require_error(row("1", R"([{"answer": "a"}])"), 1, "multi_turns[0]: missing field 'input'");
  require_error(row("1", R"([{"input": ["q"], "answer": "a"}])"), 1,
                "multi_turns[0]: field 'input' must be a string, not a list");
  require_error(row("1", R"([{"input": "q"}])"), 1, "multi_turns[0]: missing field 'answer'");
  require_error(row("1", R"([{"input": "q", "answer": null}])"), 1,
                "field 'answer' must be a string, a number or a list of strings, not null");
  require_error(row("1", R"([{"input": "q", "answer": []}])"), 1,
                "field 'answer' is an empty list");
  require_error(row("1", R"([{"input": "q", "answer": ["a", {"b": 1}]}])"), 1,
                "field 'answer' item 1 must be a string, not an object");
}

TEST_CASE("jsonl: optional options, turn task, lang and repo", "[unit]") {
  const std::string text =
      R"({"id": 1, "context": "c", "lang": "python", "repo": "psf/black", "multi_turns": [{"input": "q", "answer": "Paris", "options": ["Rome", "Paris", 3, 2.5], "task": "scbench_repoqa"}, {"input": "r", "answer": "b", "options": [], "task": null}]})"
      "\n"
      R"({"id": 2, "context": "c", "lang": null, "multi_turns": [{"input": "q", "answer": "a"}]})";
  const auto samples = load_samples_jsonl(write_jsonl("optional.jsonl", text));
  REQUIRE(samples.size() == 2);
  CHECK(samples[0].lang == "python");
  CHECK(samples[0].repo == "psf/black");
  CHECK(samples[0].task.empty());  // the loader never sets the sample's task
  REQUIRE(samples[0].turns.size() == 2);
  CHECK(samples[0].turns[0].options == std::vector<std::string>{"Rome", "Paris", "3", "2.5"});
  CHECK(samples[0].turns[0].task == "scbench_repoqa");
  CHECK(samples[0].turns[0].reference.empty());
  CHECK(samples[0].turns[1].options.empty());
  CHECK(samples[0].turns[1].task.empty());
  CHECK(samples[1].lang.empty());
  CHECK(samples[1].repo.empty());
  CHECK(samples[1].turns[0].options.empty());
  CHECK(samples[1].turns[0].task.empty());
}

TEST_CASE("jsonl: mistyped optional fields are named", "[unit]") {
  require_error(row("1", R"([{"input": "q", "answer": "a", "options": "A. x"}])"), 1,
                "multi_turns[0]: field 'options' must be a list of strings, not a string");
  require_error(row("1", R"([{"input": "q", "answer": "a", "options": {"A": "x"}}])"), 1,
                "multi_turns[0]: field 'options' must be a list of strings, not an object");
  require_error(row("1", R"([{"input": "q", "answer": "a"}, {"input": "q", "answer": "a", "options": ["x", ["y"]]}])"),
                1, "multi_turns[1]: field 'options' item 1 must be a string, not a list");
  require_error(row("1", R"([{"input": "q", "answer": "a", "task": 3}])"), 1,
                "multi_turns[0]: field 'task' must be a string, not a number");
  const std::string turns = std::string("[") + kTurn + "]";
  require_error(R"({"id": 1, "context": "c", "lang": ["py"], "multi_turns": )" + turns + "}", 1,
                "field 'lang' must be a string, not a list");
  require_error(R"({"id": 1, "context": "c", "repo": true, "multi_turns": )" + turns + "}", 1,
                "field 'repo' must be a string, not a boolean");
}

TEST_CASE("jsonl: optional documents must join to the context", "[unit]") {
  const std::string text =
      R"({"id": 1, "context": "first doc\n\nsecond doc", "documents": ["first doc", "second doc"], "multi_turns": [{"input": "q", "answer": "a"}]})"
      "\n"
      R"({"id": 2, "context": "c", "documents": null, "multi_turns": [{"input": "q", "answer": "a"}]})";
  const auto samples = load_samples_jsonl(write_jsonl("documents.jsonl", text));
  REQUIRE(samples.size() == 2);
  CHECK(samples[0].documents == std::vector<std::string>{"first doc", "second doc"});
  CHECK(samples[1].documents.empty());
  const std::string turns = std::string("[") + kTurn + "]";
  require_error(R"({"id": 1, "context": "a\n\nb", "documents": "a", "multi_turns": )" + turns + "}", 1,
                "field 'documents' must be a list of strings, not a string");
  require_error(R"({"id": 1, "context": "a\n\nb", "documents": ["a", 2], "multi_turns": )" + turns + "}",
                1, "field 'documents' item 1 must be a string, not a number");
  require_error(R"({"id": 1, "context": "a\n\nb", "documents": ["a", "c"], "multi_turns": )" + turns + "}",
                1, "field 'documents' joined with blank lines");
}

// Issue 20: numbers of 9.2e18 or more (or 1e400) were cast to long long before the range
// check, which is undefined (UBSan in CI); 1e400 was nlohmann's out_of_range (exit 3).
TEST_CASE("jsonl: numbers past long long's and double's range", "[unit]") {
  const std::string huge = write_jsonl(
      "huge.jsonl", row("9.3e18", R"([{"input": "q", "answer": [-9.3e18, 1e300, 42.0]}])") + "\n");
  const std::vector<Sample> samples = load_samples_jsonl(huge);
  REQUIRE(samples.size() == 1);
  CHECK(samples[0].id == "9.3e+18");
  CHECK(samples[0].turns[0].answers == std::vector<std::string>{"-9.3e+18", "1e+300", "42"});
  require_error(row("1e400", std::string("[") + kTurn + "]") + "\n", 1, "malformed JSON");
  require_error(row("1", R"([{"input": "q", "answer": -1e400}])") + "\n", 1, "number overflow");
}
