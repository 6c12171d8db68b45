// The scorers of tasks/scorers.h on hand-computed cases, including the inputs SCBench
// (MInference scbench/compute_scores.py) scores wrongly: each "SCBench:" case would fail
// under SCBench's behaviour.
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/input_error.h"
#include "tasks/scorers.h"

using namespace kvbench;

namespace {
const std::vector<std::string> kCapitals = {"Paris", "London", "Berlin", "Madrid"};

// The extracted number; fails the test when there is none.
double num(std::string_view text, NumberPick pick = NumberPick::first) {
  const std::optional<double> v = extract_number(text, pick);
  REQUIRE(v.has_value());
  return *v;
}
}  // namespace

TEST_CASE("normalize_en is SQuAD's normalisation", "[scorers][unit]") {
  CHECK(normalize_en("The Quick, brown fox!") == "quick brown fox");
  CHECK(normalize_en("  An apple\ta day\n") == "apple day");
  CHECK(normalize_en("well-known") == "wellknown");           // deleted, not a space
  CHECK(normalize_en("Theatre, another") == "theatre another");  // articles as words only
  CHECK(normalize_en("") == "");
  CHECK(normalize_en("the a an") == "");
  // Beyond SQuAD: typographic punctuation and Unicode spaces.
  CHECK(normalize_en("“289”… and café") == "289 and café");
}

TEST_CASE("normalize_zh drops whitespace and ASCII and CJK punctuation", "[scorers][unit]") {
  CHECK(normalize_zh("北京， 是 中国的首都！") == "北京是中国的首都");
  CHECK(normalize_zh("《红楼梦》「好」【注】…—“引”、。") == "红楼梦好注引");
  CHECK(normalize_zh("ABC，Def\u3000g") == "abcdefg");  // ideographic space
  CHECK(normalize_zh("（一）：；？") == "一");
  CHECK(normalize_zh("二〇二〇年人々") == "二〇二〇年人々");  // letters/numbers stay
}

TEST_CASE("utf8_code_points counts characters, not bytes", "[scorers][unit]") {
  CHECK(utf8_code_points("北京a") == std::u32string{U'北', U'京', U'a'});
  CHECK(utf8_code_points("\xff" "a") == std::u32string{0xFFFD, U'a'});
  CHECK(utf8_code_points("").empty());
}

TEST_CASE("exact_match compares normalised text, or the extracted answer", "[scorers][unit]") {
  CHECK(exact_match("The Answer!", {"answer"}) == 1.0);
  CHECK(exact_match("The value of key 9a1c-77 is 289.", {"289"}) == 1.0);
  CHECK(exact_match("289 or 290", {"289"}) == 0.0);
  CHECK(exact_match("Paris", {"London", "paris"}) == 1.0);  // max over answers
  CHECK(exact_match("北京。", {"北京"}) == 1.0);
  CHECK(exact_match("", {"x"}) == 0.0);
  CHECK(exact_match("x", {}) == 0.0);
  CHECK(exact_match("", {""}) == 0.0);  // an answer that normalises to nothing
}

TEST_CASE("contains matches whole words of the normalised prediction", "[scorers][unit]") {
  CHECK(contains("The value is 289.", {"289"}) == 1.0);
  CHECK(contains("The value is 2890", {"289"}) == 0.0);
  CHECK(contains("I saw New York City", {"new york"}) == 1.0);
  CHECK(contains("York New", {"new york"}) == 0.0);
  CHECK(contains("The value is “289”.", {"289"}) == 1.0);
  CHECK(contains("答案是北京。", {"北京"}) == 1.0);
  CHECK(contains("anything", {"the"}) == 0.0);
  CHECK(contains("", {"289"}) == 0.0);
  CHECK(contains("289", {}) == 0.0);
}

TEST_CASE("contains_all is the share of required answers found", "[scorers][unit]") {
  const Answers vars = {"ABCDE", "FGHIJ", "KLMNO"};
  CHECK(contains_all("VAR ABCDE, VAR FGHIJ", vars) == Approx(2.0 / 3.0));
  CHECK(contains_all("ABCDE FGHIJ KLMNO", vars) == 1.0);
  CHECK(contains_all("ABCDEF", {"ABCDE"}) == 0.0);  // whole words
  CHECK(contains_all("", vars) == 0.0);
  CHECK(contains_all("ABCDE", {}) == 0.0);
  CHECK(score(Scorer::contains_all, "KLMNO", vars) == Approx(1.0 / 3.0));
}

TEST_CASE("token_f1 is SQuAD F1 with multiset overlap", "[scorers][unit]") {
  // pred: cat sat on mat (4); gold: cat on mat (3); overlap 3: P 3/4, R 1, F1 6/7.
  CHECK(token_f1("the cat sat on the mat", {"a cat on a mat"}) == Approx(6.0 / 7.0));
  // Repeated tokens count once per match: overlap 1, P 1/3, R 1/2, F1 2/5.
  CHECK(token_f1("cat cat cat", {"cat dog"}) == Approx(0.4));
  // overlap 2, P 1, R 2/3, F1 4/5.
  CHECK(token_f1("cat cat", {"cat cat dog"}) == Approx(0.8));
  CHECK(token_f1("Paris", {"London", "Paris"}) == 1.0);
  CHECK(token_f1("", {"Paris"}) == 0.0);
  CHECK(token_f1("Paris", {}) == 0.0);
  CHECK(token_f1("the", {"the"}) == 0.0);  // nothing left after normalisation
}

TEST_CASE("SCBench: a string answer is one reference, not its characters", "[scorers][unit]") {
  // SCBench loops over a plain-string answer's characters: "s" would match "s" and score 1.
  CHECK(token_f1("s", {"Paris"}) == 0.0);
  CHECK(score(Scorer::f1_en, "s", {"Paris"}) == 0.0);
  CHECK(score(Scorer::f1_en, "Paris", {"Paris"}) == 1.0);
  // Chinese: "京" against the characters of "北京" would score 1; it is P 1, R 1/2.
  CHECK(char_f1("京", {"北京"}) == Approx(2.0 / 3.0));
}

TEST_CASE("char_f1 counts UTF-8 code points with multiset overlap", "[scorers][unit]") {
  // pred 北京是中国的首都 (8 chars), gold 中国首都是北京 (7): overlap 7, P 7/8, R 1, F1 14/15.
  CHECK(char_f1("北京是中国的首都。", {"中国首都是北京"}) == Approx(14.0 / 15.0));
  // 中 (E4 B8 AD) and 丁 (E4 B8 81) share two of three bytes; as characters they share none.
  CHECK(char_f1("丁", {"中"}) == 0.0);
  // Repeated characters: overlap 1, P 1/3, R 1, F1 1/2.
  CHECK(char_f1("哈哈哈", {"哈"}) == Approx(0.5));
  CHECK(char_f1("北京", {"北京"}) == 1.0);
  CHECK(char_f1("", {"北京"}) == 0.0);
  CHECK(char_f1("北京", {}) == 0.0);
}

TEST_CASE("extract_answer finds the value in a chat model's phrasing", "[scorers][unit]") {
  CHECK(extract_answer("The value of key 9a1c-77 is 289.") == "289");
  CHECK(extract_answer("The value associated with key \"abc\" is \"289\".") == "289");
  CHECK(extract_answer("Answer: 289") == "289");
  CHECK(extract_answer("Answer: The value of key X is 289.") == "289");
  CHECK(extract_answer("The value is 289, which is the answer.") == "289");
  CHECK(extract_answer("Sure, the value is '289'!") == "289");
  CHECK(extract_answer("289.") == "289");
  CHECK(extract_answer("\n\n  **289**\nLet me know if you need more.") == "289");
  CHECK(extract_answer("") == "");
}

TEST_CASE("extract_choice reads the chosen label", "[scorers][unit]") {
  using O = std::optional<std::string>;
  CHECK(extract_choice("(B)") == O("B"));
  CHECK(extract_choice("Answer: B") == O("B"));
  CHECK(extract_choice("B.") == O("B"));
  CHECK(extract_choice("B") == O("B"));
  CHECK(extract_choice("The answer is B) foo") == O("B"));
  CHECK(extract_choice("ANSWER: (B)") == O("B"));
  CHECK(extract_choice("The correct answer is option C.") == O("C"));
  CHECK(extract_choice("Option A is wrong; the answer is C.") == O("C"));
  CHECK(extract_choice("I think (b) fits.") == O("B"));
  CHECK(extract_choice("I think B is right") == O("B"));
  CHECK(extract_choice("I'd say D") == O("D"));   // "I'd" is a word, not a label
  CHECK(extract_choice("'B' fits") == O("B"));
  CHECK(extract_choice("A man walks into a bar") == std::nullopt);
  CHECK(extract_choice("the answer is a guess") == std::nullopt);
  CHECK(extract_choice("B or C") == std::nullopt);  // ambiguous
  CHECK(extract_choice("") == std::nullopt);
  // With options: their texts, and only their labels.
  CHECK(extract_choice("I believe it is London.", kCapitals) == O("B"));
  CHECK(extract_choice("Paris or London", kCapitals) == std::nullopt);
  CHECK(extract_choice("Answer: E", kCapitals) == std::nullopt);
  CHECK(extract_choice("dark red", {"red", "dark red"}) == O("B"));
}

TEST_CASE("multiple_choice compares the chosen label exactly", "[scorers][unit]") {
  CHECK(multiple_choice("Answer: B", {"B"}) == 1.0);
  CHECK(multiple_choice("The answer is (B).", {"(B)"}) == 1.0);
  CHECK(multiple_choice("B. London", {"b"}) == 1.0);
  CHECK(multiple_choice("Answer: B", {"C"}) == 0.0);
  CHECK(multiple_choice("London", {"London"}, kCapitals) == 1.0);  // gold as option text
  CHECK(multiple_choice("It must be Berlin", {"C"}, kCapitals) == 1.0);
  CHECK(multiple_choice("True", {"True"}) == 1.0);  // not a label: exact match
  CHECK(multiple_choice("False", {"True"}) == 0.0);
  CHECK(multiple_choice("", {"A"}) == 0.0);
  CHECK(multiple_choice("A", {}) == 0.0);
}

TEST_CASE("SCBench: a wrong option does not score by containing the label", "[scorers][unit]") {
  // SCBench's ICL.ManyShot scorer: "A" in "ANSWER: (B)".upper() -> 1.0.
  CHECK(multiple_choice("ANSWER: (B)", {"A"}) == 0.0);
  CHECK(score(Scorer::choice, "ANSWER: (B)", {"(A)"}) == 0.0);
  CHECK(score(Scorer::choice, "Answer: (C) because A and B are wrong", {"A"}) == 0.0);
  CHECK(score(Scorer::choice, "ANSWER: (B)", {"(B)"}) == 1.0);
}

TEST_CASE("extract_number reads signs, decimals and thousands separators", "[scorers][unit]") {
  CHECK(num("The largest number is 94.") == Approx(94));
  CHECK(num("-17") == Approx(-17));
  CHECK(num("x = -3.5 here") == Approx(-3.5));
  CHECK(num("\u22124") == Approx(-4));  // U+2212 minus
  CHECK(num("1,234,567 items") == Approx(1234567));
  CHECK(num("1,2") == Approx(1));
  CHECK(num("1,2", NumberPick::last) == Approx(2));
  CHECK(num("1,2345") == Approx(1));
  CHECK(num("3-5") == Approx(3));
  CHECK(num("3-5", NumberPick::last) == Approx(5));
  CHECK(num("a3f9 then 7") == Approx(7));
  CHECK(num("v2.1 is 8") == Approx(8));
  CHECK(num("about .5") == Approx(0.5));
  CHECK(num("between 10 and 20", NumberPick::last) == Approx(20));
  CHECK_FALSE(extract_number("no number here").has_value());
  CHECK_FALSE(extract_number("").has_value());
}

TEST_CASE("numeric_match compares the first number numerically", "[scorers][unit]") {
  CHECK(numeric_match("The answer is 3.50", {"3.5"}) == 1.0);
  CHECK(numeric_match("1,234", {"1234"}) == 1.0);
  CHECK(numeric_match("94", {"95"}) == 0.0);
  CHECK(numeric_match("-3", {"3"}) == 0.0);  // the sign counts
  CHECK(numeric_match("The smallest is 7, the largest 94", {"94"}) == 0.0);  // first number
  CHECK(numeric_match("94", {"7", "94"}) == 1.0);
  CHECK(numeric_match("", {"94"}) == 0.0);
  CHECK(numeric_match("94", {}) == 0.0);
  CHECK(numeric_match("94", {"none"}) == 0.0);
}

TEST_CASE("code_f1 compares the first fenced block with the gold function", "[scorers][unit]") {
  const std::string gold = "def f(x):\n    return x + 1";
  CHECK(code_f1("Here it is:\n```python\ndef f(x):\n    return x + 1\n```\nDone.", {gold}) == 1.0);
  // tokens def f(x): return x + 1 (6) vs def f(x): return x - 1 (6): overlap 5, F1 5/6.
  CHECK(code_f1("def f(x): return x - 1", {gold}) == Approx(5.0 / 6.0));
  CHECK(code_f1("", {gold}) == 0.0);
}

TEST_CASE("the scorer registry maps names, and names an unknown one", "[scorers][unit]") {
  const std::vector<std::string> expected = {"exact", "contains", "f1_en", "f1_zh",
                                             "choice", "number", "code", "contains_all", "function"};
  CHECK(scorer_names() == expected);
  for (const std::string& name : expected) CHECK(scorer_name(scorer_from_name(name)) == name);
  CHECK(scorer_from_name("f1_zh") == Scorer::f1_zh);
  CHECK_THROWS_AS(scorer_from_name("bleu"), InputError);
  CHECK_THROWS_WITH(scorer_from_name("bleu"), Catch::Contains("'bleu'"));
  CHECK_THROWS_AS(scorer_from_name("Exact"), InputError);
  // score() dispatches to the metric.
  CHECK(score(Scorer::exact, "Answer: 289", {"289"}) == 1.0);
  CHECK(score(Scorer::contains, "it is 289.", {"289"}) == 1.0);
  CHECK(score(Scorer::f1_zh, "北京", {"北京市"}) == Approx(0.8));
  CHECK(score(Scorer::number, "about 1,000", {"1000"}) == 1.0);
  for (const std::string& name : expected) {
    const double s = score(scorer_from_name(name), "", {});
    CHECK(s == 0.0);
  }
}

TEST_CASE("SCBench: the mixed retrieval task scores the KV turns' text", "[scorers][unit]") {
  // SCBench (multi-request) tests `label in record` on the prediction record, so every KV
  // turn scores 0; the text holds the value, so it scores 1.
  const std::string value = "5e1f0c3a-1b2d-4e5f-8a9b-0c1d2e3f4a5b";
  const std::string gold_code = "def f(x):\n    return x + 1";
  const std::vector<MixedTurn> turns = {
      {MixPart::code, "```\ndef f(x):\n    return x + 1\n```", {gold_code}},
      {MixPart::kv, "The value of the key is \"" + value + "\".", {value}},
      {MixPart::code, "I could not find it.", {gold_code}},
      {MixPart::kv, "The value is 1234.", {value}},
  };
  CHECK(score_mixed_turn(turns[1]) == 1.0);
  const MixedScore s = score_mixed_retrieval(turns);
  CHECK(s.n_kv == 2);
  CHECK(s.n_code == 2);
  CHECK(s.kv == Approx(0.5));
  CHECK(s.code == Approx(0.5));
  CHECK(s.overall == Approx(0.5));
  const MixedScore none = score_mixed_retrieval({});
  CHECK(none.overall == 0.0);
  CHECK(none.n_kv == 0);
}

TEST_CASE("every scorer stays in [0, 1] on arbitrary text", "[scorers][unit]") {
  // Random strings over an alphabet of the characters the scanners branch on, including
  // truncated and invalid UTF-8.
  const std::vector<std::string> alphabet = {
      "A", "B", "a", "I", " ", "\n", "(", ")", "[", "]", ".", ",", ":", "-", "+", "1", "0",
      "9", "\"", "'", "`", "*", "answer", "option", " is ", "value:", "```", "北", "京", "。",
      "，", "\u2212", "\u201C", "\xe4", "\xb8", "\xff", "the"};
  std::mt19937 rng(5);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1), len(0, 12);
  auto random_text = [&] {
    std::string s;
    for (size_t n = len(rng); n > 0; --n) s += alphabet[pick(rng)];
    return s;
  };
  for (int i = 0; i < 2000; ++i) {
    const std::string pred = random_text();
    const Answers answers = {random_text(), random_text()};
    for (const std::string& name : scorer_names()) {
      const double s = score(scorer_from_name(name), pred, answers);
      REQUIRE(s >= 0.0);
      REQUIRE(s <= 1.0);
    }
    REQUIRE(multiple_choice(pred, answers, kCapitals) >= 0.0);
    // A prediction matches itself unless it normalises to nothing.
    const bool non_empty = !normalize_en(pred).empty() ||
                           (std::any_of(pred.begin(), pred.end(), [](char c) { return c & 0x80; }) &&
                            !normalize_zh(pred).empty());
    INFO(pred);
    REQUIRE(score(Scorer::exact, pred, {pred}) == (non_empty ? 1.0 : 0.0));
  }
}
