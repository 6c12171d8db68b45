// The task catalog: every task's format, SCBench's templates applied to raw samples, and
// each turn scored by its own task's scorer.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "common/input_error.h"
#include "tasks/task_catalog.h"

using namespace kvbench;

namespace {

SampleTurn raw_turn(const std::string& input, std::vector<std::string> answers,
                    std::vector<std::string> options = {}, const std::string& task = "") {
  SampleTurn turn;
  turn.input = input;
  turn.answers = std::move(answers);
  turn.options = std::move(options);
  turn.task = task;
  return turn;
}

Sample raw_sample(const std::string& context, std::vector<SampleTurn> turns) {
  Sample sample;
  sample.id = "s1";
  sample.context = context;
  sample.turns = std::move(turns);
  return sample;
}

const std::vector<std::string> kCities = {"Rome", "Paris", "Berlin", "Madrid"};

}  // namespace

TEST_CASE("catalog: every task has a unique name and a decode budget", "[unit]") {
  std::set<std::string> seen;
  bool scbench_seen = false;
  for (const TaskFormat& f : task_formats()) {
    INFO(f.name);
    CHECK(f.max_new_tokens > 0);
    CHECK_FALSE(f.summary.empty());
    CHECK(seen.insert(f.name).second);
    CHECK(find_task_format(f.name) == &f);
    // Generated tasks come first.
    if (f.source == TaskSource::Scbench) scbench_seen = true;
    if (scbench_seen) CHECK(f.source == TaskSource::Scbench);
  }
  CHECK(task_formats().front().name == "retr_kv");
  CHECK(seen.size() == 23);
  CHECK(find_task_format("retr_kv")->scorer == Scorer::contains);
  CHECK(find_task_format("multihop_vt")->scorer == Scorer::contains_all);
  CHECK(find_task_format("math_find")->max_new_tokens == 16);
  CHECK(find_task_format("docs_kv")->scorer == Scorer::contains);
  CHECK(find_task_format("scbench_repoqa")->max_new_tokens == 1024);
  CHECK(find_task_format("scbench_repoqa")->scorer == Scorer::code);
  CHECK(find_task_format("scbench_mf")->max_new_tokens == 5);
  CHECK(find_task_format("scbench_qa_chn")->scorer == Scorer::f1_zh);
  CHECK(find_task_format("scbench_many_shot")->scorer == Scorer::choice);
  CHECK(find_task_format("scbench_passkey")->max_new_tokens == 15);
  CHECK(find_task_format("nope") == nullptr);
  CHECK(find_task_format("scbench_summary") == nullptr);
  CHECK(task_format("scbench_vt").max_new_tokens == 30);
  CHECK_THROWS_AS(task_format("nope"), InputError);
  CHECK_THROWS_WITH(task_format("nope"), Catch::Contains("unknown task 'nope'") &&
                                             Catch::Contains("retr_kv") &&
                                             Catch::Contains("scbench_mf"));
  CHECK_THROWS_WITH(task_format("scbench_summary"), Catch::Contains("ROUGE"));
}

TEST_CASE("catalog: SCBench retrieval templates wrap the context, not the turns", "[unit]") {
  const Sample raw = raw_sample("{\"k1\": \"v1\"}", {raw_turn("Key: \"k1\"\nThe value is: ", {"v1"})});
  const Sample kv = format_scbench_sample("scbench_kv", raw);
  CHECK(kv.task == "scbench_kv");
  CHECK(kv.id == "s1");
  CHECK(kv.context ==
        "Extract the value corresponding to the specified key in the JSON object below.\n\n"
        "{\"k1\": \"v1\"}");
  REQUIRE(kv.turns.size() == 1);
  CHECK(kv.turns[0].input == raw.turns[0].input);
  CHECK(kv.turns[0].answers == raw.turns[0].answers);
  CHECK(kv.turns[0].reference.empty());

  CHECK(format_scbench_sample("scbench_kv_compressible", raw).context ==
        "Extract the value corresponding to the specified key in the following passage.\n\n"
        "{\"k1\": \"v1\"}");
  CHECK(format_scbench_sample("scbench_prefix_suffix", raw).context == raw.context);
  CHECK(format_scbench_sample("scbench_passkey", raw)
            .context.rfind("There is an important info hidden inside a lot of irrelevant text.", 0) == 0);
  const Sample repoqa = format_scbench_sample("scbench_repoqa", raw);
  CHECK(repoqa.context.rfind("Based on the function description and code context, please "
                             "retrieve and repeat the exact described function from the code "
                             "context in a code block wrapped by ```:\n\n",
                             0) == 0);
}

TEST_CASE("catalog: SCBench QA and multiple-choice query templates", "[unit]") {
  const Sample raw = raw_sample("A book.", {raw_turn("Where is it?", {"Paris"}, kCities),
                                            raw_turn("And then?", {"B"}, kCities)});
  const Sample choice = format_scbench_sample("scbench_choice_eng", raw);
  CHECK(choice.context == "Read the book and answer the question.\n\nA book.");
  REQUIRE(choice.turns.size() == 2);
  CHECK(choice.turns[0].input ==
        "Question: Where is it?\nA. Rome\nB. Paris\nC. Berlin\nD. Madrid\n\n"
        "The the correct answer is");
  CHECK(choice.turns[0].options == kCities);
  CHECK(choice.turns[0].answers == std::vector<std::string>{"Paris"});
  CHECK(choice.turns[1].input.rfind("Question: And then?\nA. Rome\n", 0) == 0);

  const Sample qa = format_scbench_sample("scbench_qa_eng", raw);
  CHECK(qa.context ==
        "Read the book and answer the question. Be very concise in your answer.\n\nA book.");
  CHECK(qa.turns[0].input == "Question: Where is it?\nAnswer:");

  const Sample zh = format_scbench_sample("scbench_qa_chn", raw);
  CHECK(zh.context == "阅读以下书籍然后回答问题。\n\nA book.");
  CHECK(zh.turns[1].input == "问题：And then?\n答案：");
}

TEST_CASE("catalog: SCBench Math.Find asks for the target and repeats the first turn", "[unit]") {
  const std::string first =
      "You should answer with only one number, no other words. The largest number of the list is: ";
  const std::string second = "The smallest number of the list is: ";
  const Sample raw = raw_sample("[3, 94, 7]", {raw_turn(first, {"94"}), raw_turn(second, {"3"})});
  const Sample mf = format_scbench_sample("scbench_mf", raw);
  CHECK(mf.context == first + "\n\n[3, 94, 7]");
  CHECK(mf.turns[0].input == "What is the largest number of the list?\n\n" + first);
  CHECK(mf.turns[1].input == "What is the smallest number of the list?\n\n" + second);

  // The greedy ".+" runs to the last " is" of the line, and not past a newline.
  const Sample greedy = format_scbench_sample(
      "scbench_mf", raw_sample("x", {raw_turn("The Median of this list is: \nThe end is", {"1"})}));
  CHECK(greedy.turns[0].input.rfind("What is the median of this list?\n\n", 0) == 0);

  const Sample none = raw_sample("x", {raw_turn(first, {"94"}), raw_turn("Give the max.", {"94"})});
  CHECK_THROWS_WITH(format_scbench_sample("scbench_mf", none),
                    Catch::Contains("scbench_mf") && Catch::Contains("'s1'") &&
                        Catch::Contains("turn 2"));
}

TEST_CASE("catalog: SCBench variable tracking feeds every name as the reference", "[unit]") {
  const Sample raw = raw_sample("VAR A = 1 ...", {raw_turn("Which?", {"A", "B", "C"})});
  const Sample vt = format_scbench_sample("scbench_vt", raw);
  CHECK(vt.context == raw.context);
  CHECK(vt.turns[0].input == "Which?");
  CHECK(vt.turns[0].reference == "A, B, C");
  CHECK(gold_text(vt.turns[0]) == "A, B, C");
  CHECK(vt.turns[0].answers == raw.turns[0].answers);
}

TEST_CASE("catalog: SCBench RepoQA+KV keeps each turn's task", "[unit]") {
  Sample raw = raw_sample("code and json", {raw_turn("find f", {"def f(): pass"}, {}, "scbench_repoqa"),
                                            raw_turn("key k", {"v"}, {}, "scbench_kv")});
  raw.lang = "python";
  const Sample mixed = format_scbench_sample("scbench_repoqa_and_kv", raw);
  CHECK(mixed.task == "scbench_repoqa_and_kv");
  CHECK(mixed.context == "code and json");
  CHECK(mixed.lang == "python");
  REQUIRE(mixed.turns.size() == 2);
  CHECK(mixed.turns[0].task == "scbench_repoqa");
  CHECK(mixed.turns[1].task == "scbench_kv");
  CHECK(mixed.turns[1].input == "key k");
  CHECK(max_new_tokens_for(mixed) == 1024);

  Sample bad = raw;
  bad.turns[1].task = "scbench_qa_eng";
  CHECK_THROWS_WITH(format_scbench_sample("scbench_repoqa_and_kv", bad),
                    Catch::Contains("'s1'") && Catch::Contains("turn 2") &&
                        Catch::Contains("scbench_qa_eng"));
  bad.turns[1].task.clear();
  CHECK_THROWS_AS(format_scbench_sample("scbench_repoqa_and_kv", bad), InputError);
}

TEST_CASE("catalog: format_scbench_sample rejects what SCBench's templates cannot take", "[unit]") {
  const Sample raw = raw_sample("c", {raw_turn("q", {"a"})});
  CHECK_THROWS_WITH(format_scbench_sample("retr_kv", raw),
                    Catch::Contains("task 'retr_kv' is not an SCBench task") &&
                        Catch::Contains("scbench_kv"));
  CHECK_THROWS_WITH(format_scbench_sample("nope", raw), Catch::Contains("'nope'"));
  CHECK_THROWS_WITH(format_scbench_sample("scbench_summary", raw), Catch::Contains("ROUGE"));

  const Sample three = raw_sample("c", {raw_turn("q", {"A"}, kCities), raw_turn("q", {"A"}, {"x", "y", "z"})});
  CHECK_THROWS_WITH(format_scbench_sample("scbench_choice_eng", three),
                    Catch::Contains("scbench_choice_eng") && Catch::Contains("'s1'") &&
                        Catch::Contains("turn 2") && Catch::Contains("has 3"));

  // A turn that names another task in a single-task file is a wrong file.
  const Sample other = raw_sample("c", {raw_turn("q", {"a"}, {}, "scbench_repoqa")});
  CHECK_THROWS_WITH(format_scbench_sample("scbench_kv", other), Catch::Contains("scbench_repoqa"));
  CHECK_NOTHROW(format_scbench_sample("scbench_kv", raw));

  // One line per error.
  for (const Sample& bad : {raw, three}) {
    try {
      format_scbench_sample(bad.turns.size() == 1 ? "retr_kv" : "scbench_choice_eng", bad);
      FAIL("no error");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("catalog: score_turn uses the turn's task's scorer", "[unit]") {
  Sample kv = format_scbench_sample("scbench_kv", raw_sample("c", {raw_turn("k", {"1234abcd"})}));
  CHECK(score_turn(kv, kv.turns[0], "The value is 1234abcd") == 1.0);
  CHECK(score_turn(kv, kv.turns[0], "The value is 1234abce") == 0.0);

  const Sample vt = format_scbench_sample(
      "scbench_vt", raw_sample("c", {raw_turn("q", {"AAA", "BBB", "CCC", "DDD"})}));
  CHECK(score_turn(vt, vt.turns[0], "They are AAA and CCC.") == Approx(0.5));

  // With the options a gold option text and a named option both count; without them
  // neither would.
  const Sample choice = format_scbench_sample(
      "scbench_choice_eng", raw_sample("c", {raw_turn("Where?", {"Paris"}, kCities),
                                             raw_turn("Where?", {"B"}, kCities)}));
  CHECK(score_turn(choice, choice.turns[0], "B") == 1.0);
  CHECK(score_turn(choice, choice.turns[0], "C") == 0.0);
  CHECK(score_turn(choice, choice.turns[1], "I'd pick Paris.") == 1.0);
  CHECK(score_turn(choice, choice.turns[1], "I'd pick Berlin.") == 0.0);

  const Sample mf = format_scbench_sample(
      "scbench_mf", raw_sample("c", {raw_turn("The largest number is: ", {"94"})}));
  CHECK(score_turn(mf, mf.turns[0], "94") == 1.0);
  CHECK(score_turn(mf, mf.turns[0], "The largest number is 94.") == 1.0);
  CHECK(score_turn(mf, mf.turns[0], "95") == 0.0);

  const Sample qa = format_scbench_sample(
      "scbench_qa_eng", raw_sample("c", {raw_turn("Who?", {"the old fisherman"})}));
  CHECK(score_turn(qa, qa.turns[0], "an old man") == Approx(0.5));

  Sample untagged = kv;
  untagged.task.clear();
  CHECK_THROWS_AS(score_turn(untagged, untagged.turns[0], "x"), InputError);
  untagged.task = "nope";
  CHECK_THROWS_WITH(score_turn(untagged, untagged.turns[0], "x"),
                    Catch::Contains("unknown task 'nope'") && Catch::Contains("turn 1"));
}

TEST_CASE("catalog: a mix sample scores and budgets each turn by its part", "[unit]") {
  // Shaped as generate_samples makes a mix: the sample's task "mix", each turn its part's.
  Sample mix;
  mix.id = "mix-seed0-0";
  mix.task = "mix";
  mix.context = "...";
  mix.turns = {raw_turn("key?", {"v1"}, {}, "retr_kv"),
               raw_turn("vars?", {"X", "Y", "Z", "W"}, {}, "multihop_vt")};
  // contains would give 1 for one name of four; contains_all gives 1/4.
  CHECK(score_turn(mix, mix.turns[1], "X") == Approx(0.25));
  CHECK(score_turn(mix, mix.turns[1], "X, Y, Z and W") == 1.0);
  CHECK(score_turn(mix, mix.turns[0], "It is v1.") == 1.0);
  CHECK(max_new_tokens_for(mix) == 96);

  // The largest budget over the turns' tasks, not the mix's own.
  mix.turns[0].task = "math_find";
  mix.turns[0].answers = {"7"};
  CHECK(max_new_tokens_for(mix) == 64);
  CHECK(score_turn(mix, mix.turns[0], "7") == 1.0);
  CHECK(score_turn(mix, mix.turns[0], "The answer is 8, not 7") == 0.0);

  // A mix turn without its part cannot be scored by the mix's placeholder scorer.
  mix.turns[0].task.clear();
  CHECK_THROWS_AS(score_turn(mix, mix.turns[0], "7"), InputError);

  Sample single;
  single.task = "scbench_kv";
  CHECK(max_new_tokens_for(single) == 150);
  single.turns = {raw_turn("q", {"a"})};
  CHECK(max_new_tokens_for(single) == 150);
  single.task = "nope";
  CHECK_THROWS_AS(max_new_tokens_for(single), InputError);
}
