// The seeded task generators (datasets/generator.h) with the tiny GGUF's byte-level
// tokenizer: determinism, sizing, answers correct by construction (each context parsed
// back), and the errors for bad tasks and knobs. The real tokenizer's sizing is in
// test_generators_model.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "datasets/generator.h"
#include "gguf_writer.h"
#include "common/input_error.h"
#include "harness/model/gguf.h"
#include "harness/model/tokenizer.h"

using namespace kvbench;

namespace {

const Tokenizer& tiny_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    const std::string path = testing::temp_path("tiny_generators.gguf");
    testing::write_tiny_llama_gguf(path, testing::TinyLlamaSpec{});
    GgufFile file(path);
    return std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
  }();
  return *tok;
}

GeneratorOptions opts(const std::string& task, int64_t tokens = 1500, int32_t turns = 5,
                      uint64_t seed = 7, std::map<std::string, std::string> knobs = {}) {
  GeneratorOptions o;
  o.task = task;
  o.context_tokens = tokens;
  o.turns = turns;
  o.samples = 2;
  o.seed = seed;
  o.knobs = std::move(knobs);
  return o;
}

bool same(const std::vector<Sample>& a, const std::vector<Sample>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].id != b[i].id || a[i].context != b[i].context) return false;
    if (a[i].turns.size() != b[i].turns.size()) return false;
    for (size_t t = 0; t < a[i].turns.size(); ++t) {
      if (a[i].turns[t].input != b[i].turns[t].input) return false;
      if (a[i].turns[t].answers != b[i].turns[t].answers) return false;
    }
  }
  return true;
}

std::string quoted_after(const std::string& s, const std::string& marker) {
  const size_t p = s.find(marker);
  REQUIRE(p != std::string::npos);
  const size_t b = p + marker.size();
  const size_t e = s.find('"', b);
  REQUIRE(e != std::string::npos);
  return s.substr(b, e - b);
}

std::string error_of(const GeneratorOptions& o) {
  try {
    generate_samples(o, tiny_tokenizer());
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

// The synthetic tasks (niah and repoqa, cut from corpora, are in test_corpus_tasks.cpp).
const char* const kTasks[] = {"retr_kv", "retr_prefix_suffix", "multihop_vt", "math_find",
                              "docs_kv", "mix"};

// retr_kv: the JSON object's pairs, in order.
std::vector<std::pair<std::string, std::string>> kv_pairs(const std::string& context) {
  const size_t open = context.find('{');
  REQUIRE(open != std::string::npos);
  REQUIRE(context.back() == '}');
  const std::string body = context.substr(open);
  std::vector<std::pair<std::string, std::string>> pairs;
  static const std::regex pair_re("\"([0-9a-f-]+)\": \"([0-9a-f-]+)\"");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), pair_re); it != std::sregex_iterator();
       ++it) {
    pairs.emplace_back((*it)[1].str(), (*it)[2].str());
  }
  return pairs;
}

}  // namespace

TEST_CASE("task registry lists every task with its knobs and defaults", "[unit]") {
  const auto& reg = task_registry();
  std::vector<std::string> names;
  for (const auto& t : reg) {
    names.push_back(t.name);
    CHECK_FALSE(t.description.empty());
    for (const auto& k : t.knobs) {
      CHECK_FALSE(k.name.empty());
      CHECK_FALSE(k.default_value.empty());
      CHECK_FALSE(k.description.empty());
    }
  }
  std::vector<std::string> expected(std::begin(kTasks), std::end(kTasks));
  expected.insert(expected.end() - 1, {"niah", "repoqa", "repoqa_function"});
  CHECK(names == expected);
}

TEST_CASE("generators are deterministic per seed and sized within 2%", "[unit]") {
  for (const char* task : kTasks) {
    for (int64_t tokens : {700, 3000}) {
      INFO(task << " at " << tokens);
      const auto a = generate_samples(opts(task, tokens), tiny_tokenizer());
      const auto b = generate_samples(opts(task, tokens), tiny_tokenizer());
      const auto c = generate_samples(opts(task, tokens, 5, 8), tiny_tokenizer());
      REQUIRE(a.size() == 2);
      CHECK(same(a, b));
      CHECK_FALSE(same(a, c));
      CHECK(a[0].context != a[1].context);  // samples differ
      CHECK(a[0].id != a[1].id);
      for (const auto& s : a) {
        CHECK(s.turns.size() == 5);
        const int64_t n = count_context_tokens(tiny_tokenizer(), s.context);
        CHECK(std::abs(n - tokens) <= tokens * kContextTolerance);
        for (const auto& t : s.turns) {
          CHECK_FALSE(t.input.empty());
          REQUIRE_FALSE(t.answers.empty());
          CHECK_FALSE(t.answers[0].empty());
        }
      }
    }
  }
}

TEST_CASE("docs_kv: documents join to the context, each answer in exactly one of them", "[unit]") {
  const auto samples = generate_samples(opts("docs_kv", 1500, 6, 3, {{"documents", "6"}}),
                                        tiny_tokenizer());
  REQUIRE(samples.size() == 2);
  for (const auto& s : samples) {
    REQUIRE(s.documents.size() == 6);
    std::string joined;
    for (size_t i = 0; i < s.documents.size(); ++i) joined += (i ? "\n\n" : "") + s.documents[i];
    CHECK(joined == s.context);
    std::set<std::string> asked;
    for (const auto& turn : s.turns) {
      REQUIRE(turn.answers.size() == 1);
      const std::string& value = turn.answers[0];
      CHECK(value.size() == 6);
      CHECK(asked.insert(value).second);  // every turn a different fact
      const auto holding =
          std::count_if(s.documents.begin(), s.documents.end(),
                        [&](const std::string& d) { return d.find(value) != std::string::npos; });
      CHECK(holding == 1);
      // The question names the project whose document holds the value.
      const size_t project = turn.input.find("Project ");
      REQUIRE(project != std::string::npos);
      const std::string name = turn.input.substr(project, turn.input.find('?') - project);
      for (const auto& d : s.documents) {
        if (d.find(value) != std::string::npos) CHECK(d.rfind("Notes on " + name + ".\n", 0) == 0);
      }
    }
  }
  // The same documents in every sample of a seed, in each sample's own order.
  std::multiset<std::string> a(samples[0].documents.begin(), samples[0].documents.end());
  std::multiset<std::string> b(samples[1].documents.begin(), samples[1].documents.end());
  CHECK(a == b);
  CHECK(samples[0].documents != samples[1].documents);
  // Deterministic by seed.
  const auto again =
      generate_samples(opts("docs_kv", 1500, 6, 3, {{"documents", "6"}}), tiny_tokenizer());
  CHECK(again[0].documents == samples[0].documents);
  CHECK_THAT(error_of(opts("docs_kv", 1500, 10, 3, {{"documents", "6"}})),
             Catch::Matchers::Contains(
                 "task docs_kv: knob documents 6 holds 9 facts, fewer than the 10 turns"));
}

TEST_CASE("retr_kv: each asked key's value in the JSON is the answer", "[unit]") {
  for (const auto& knobs : {std::map<std::string, std::string>{},
                            std::map<std::string, std::string>{{"key_length", "8"}}}) {
    const auto samples = generate_samples(opts("retr_kv", 1200, 5, 3, knobs), tiny_tokenizer());
    for (const auto& s : samples) {
      CHECK(s.context.rfind("Extract the value corresponding to the specified key in the JSON "
                            "object below.\n\n{", 0) == 0);
      const auto pairs = kv_pairs(s.context);
      std::map<std::string, std::string> kv(pairs.begin(), pairs.end());
      CHECK(kv.size() == pairs.size());  // keys unique
      std::set<std::string> asked;
      for (const auto& t : s.turns) {
        const std::string key = quoted_after(t.input, "Key: \"");
        CHECK(t.input == "Key: \"" + key + "\"\nThe value associated with the specified key is: ");
        REQUIRE(kv.count(key) == 1);
        CHECK(kv[key] == t.answers[0]);
        asked.insert(key);
        if (knobs.empty()) {  // a UUID: 8-4-4-4-12 hex
          CHECK(std::regex_match(key, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                                                 "[0-9a-f]{12}")));
          CHECK(t.answers[0].size() == 36);
        } else {
          CHECK(key.size() == 8);
        }
      }
      CHECK(asked.size() == s.turns.size());  // a different key each turn
    }
  }
}

TEST_CASE("retr_prefix_suffix: exactly one string has the asked prefix and suffix", "[unit]") {
  const auto samples = generate_samples(
      opts("retr_prefix_suffix", 1500, 4, 11, {{"distractors", "3"}, {"string_length", "16"}}),
      tiny_tokenizer());
  for (const auto& s : samples) {
    const size_t start = s.context.find("\n\n");
    REQUIRE(start != std::string::npos);
    std::vector<std::string> lines;
    std::istringstream in(s.context.substr(start + 2));
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    REQUIRE(lines.size() > 20);
    for (const auto& t : s.turns) {
      const std::string pre = quoted_after(t.input, "the prefix \"");
      const std::string suf = quoted_after(t.input, "the suffix \"");
      CHECK(pre.size() == 4);
      CHECK(suf.size() == 4);
      int both = 0, with_pre = 0, with_suf = 0;
      std::string found;
      for (const auto& l : lines) {
        const bool p = l.rfind(pre, 0) == 0;
        const bool q = l.size() >= suf.size() && l.compare(l.size() - suf.size(), suf.size(), suf) == 0;
        with_pre += p;
        with_suf += q;
        if (p && q) {
          ++both;
          found = l;
        }
      }
      CHECK(both == 1);
      CHECK(found == t.answers[0]);
      CHECK(found.size() == 16);
      CHECK(with_pre >= 4);  // the answer and 3 distractors
      CHECK(with_suf >= 4);
    }
  }
}

TEST_CASE("multihop_vt: the chain of assignments resolves to the answer", "[unit]") {
  const auto samples =
      generate_samples(opts("multihop_vt", 1500, 3, 5, {{"hops", "3"}, {"chains", "4"}}),
                       tiny_tokenizer());
  for (const auto& s : samples) {
    CHECK(s.context.rfind("Memorize and track the chain(s) of variable assignment hidden in the "
                          "following text.\n\n", 0) == 0);
    CHECK(s.context.find("The grass is green.") != std::string::npos);
    // Replay the assignments in text order: each right-hand variable must already be set.
    static const std::regex stmt("VAR ([A-Z]{5}) = (VAR ([A-Z]{5})|([0-9]+))\\.");
    std::map<std::string, std::string> value;
    int statements = 0;
    for (auto it = std::sregex_iterator(s.context.begin(), s.context.end(), stmt);
         it != std::sregex_iterator(); ++it) {
      const auto& m = *it;
      REQUIRE(value.count(m[1].str()) == 0);  // each variable assigned once
      if (m[3].matched) {
        REQUIRE(value.count(m[3].str()) == 1);  // in chain order
        value[m[1].str()] = value[m[3].str()];
      } else {
        value[m[1].str()] = m[4].str();
      }
      ++statements;
    }
    CHECK(statements == 4 * 4);  // 4 chains of 1 value + 3 hops
    std::set<std::string> asked;
    for (const auto& t : s.turns) {
      static const std::regex q("Question: Find all variables that are assigned the value ([0-9]+) "
                                "in the text above\\. Answer: According to the chain\\(s\\) of "
                                "variable assignment in the text above, 4 variables are assigned "
                                "the value ([0-9]+), they are: ");
      std::smatch m;
      REQUIRE(std::regex_match(t.input, m, q));
      CHECK(m[1].str() == m[2].str());
      CHECK(m[1].str().size() == 5);
      std::set<std::string> holders;
      for (const auto& [var, v] : value) {
        if (v == m[1].str()) holders.insert(var);
      }
      CHECK(holders == std::set<std::string>(t.answers.begin(), t.answers.end()));
      CHECK(t.answers.size() == 4);
      // Every name is required; the gold answer the session feeds lists them all.
      CHECK(t.reference == t.answers[0] + ", " + t.answers[1] + ", " + t.answers[2] + ", " +
                               t.answers[3]);
      CHECK(gold_text(t) == t.reference);
      asked.insert(m[1].str());
    }
    CHECK(asked.size() == 3);
  }
}

TEST_CASE("math_find: the answers are the list's extremes and median", "[unit]") {
  const auto samples = generate_samples(opts("math_find", 1500, 5, 9), tiny_tokenizer());
  for (const auto& s : samples) {
    const size_t open = s.context.find('[');
    REQUIRE(open != std::string::npos);
    REQUIRE(s.context.back() == ']');
    std::vector<long long> nums;
    std::istringstream in(s.context.substr(open + 1));
    for (std::string item; std::getline(in, item, ',');) nums.push_back(std::stoll(item));
    REQUIRE(nums.size() % 2 == 1);
    for (long long x : nums) CHECK((x >= 100 && x <= 999));
    std::vector<long long> sorted = nums;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    CHECK(sorted[n - 1] > sorted[n - 2]);  // the extremes are unique
    CHECK(sorted[n - 2] > sorted[n - 3]);
    CHECK(sorted[0] < sorted[1]);
    CHECK(sorted[1] < sorted[2]);
    const std::vector<std::pair<std::string, long long>> expect = {
        {"the largest number of the list", sorted[n - 1]},
        {"the smallest number of the list", sorted[0]},
        {"the second largest number of the list", sorted[n - 2]},
        {"the second smallest number of the list", sorted[1]},
        {"the median of the list", sorted[n / 2]}};
    REQUIRE(s.turns.size() == expect.size());
    for (size_t t = 0; t < expect.size(); ++t) {
      std::string cap = expect[t].first;
      cap[0] = 'T';
      CHECK(s.turns[t].input == "What is " + expect[t].first +
                                    "?\n\nYou should answer with only one number, no other words. " +
                                    cap + " is: ");
      CHECK(s.turns[t].answers == std::vector<std::string>{std::to_string(expect[t].second)});
    }
  }
}

TEST_CASE("math_find lists and questions: each turn asks its own list's extreme", "[unit]") {
  const auto samples = generate_samples(
      opts("math_find", 1500, 5, 9, {{"lists", "5"}, {"questions", "2"}}), tiny_tokenizer());
  for (const auto& s : samples) {
    REQUIRE(s.turns.size() == 5);
    size_t total = 0;
    for (int t = 0; t < 5; ++t) {
      const std::string name = std::string("List ") + char('A' + t);
      const size_t at = s.context.find(name + ": [");
      REQUIRE(at != std::string::npos);
      std::vector<long long> nums;
      std::istringstream in(s.context.substr(at + name.size() + 3,
                                             s.context.find(']', at) - at - name.size() - 3));
      for (std::string item; std::getline(in, item, ',');) nums.push_back(std::stoll(item));
      REQUIRE(nums.size() % 2 == 1);
      total += nums.size();
      const auto [low, high] = std::minmax_element(nums.begin(), nums.end());
      const bool largest = t % 2 == 0;
      CHECK(s.turns[t].input.find(std::string(largest ? "the largest number of " : "the smallest number of ") + name) !=
            std::string::npos);
      CHECK(s.turns[t].answers == std::vector<std::string>{std::to_string(largest ? *high : *low)});
      CHECK(std::count(nums.begin(), nums.end(), largest ? *high : *low) == 1);
    }
    CHECK(total > 100);  // the numbers fill the context, dealt round the lists
  }
  using Catch::Matchers::Contains;
  CHECK_THAT(error_of(opts("math_find", 1500, 5, 9, {{"lists", "4"}})),
             Contains("turns 5 is more than knob lists 4"));
  CHECK_THAT(error_of(opts("math_find", 1500, 3, 9, {{"questions", "2"}})),
             Contains("turns 3 is more than the 2 questions of one list"));
}

TEST_CASE("mix: both contexts, turns alternating, each answer right", "[unit]") {
  const auto samples =
      generate_samples(opts("mix", 2000, 5, 2, {{"tasks", "retr_kv+math_find"}, {"digits", "4"}}),
                       tiny_tokenizer());
  for (const auto& s : samples) {
    const size_t kv_at = s.context.find("Extract the value");
    const size_t mf_at = s.context.find("Answer the questions about the list of numbers");
    REQUIRE(kv_at == 0);
    REQUIRE(mf_at != std::string::npos);
    const std::string kv_part = s.context.substr(0, mf_at - 2);
    const auto pairs = kv_pairs(kv_part);
    std::map<std::string, std::string> kv(pairs.begin(), pairs.end());
    REQUIRE(s.turns.size() == 5);
    CHECK(s.task == "mix");
    for (size_t t = 0; t < s.turns.size(); ++t) {
      // Each turn is scored by its part's task.
      CHECK(turn_task(s, s.turns[t]) == (t % 2 == 0 ? "retr_kv" : "math_find"));
      CHECK(gold_text(s.turns[t]) == s.turns[t].answers[0]);
      if (t % 2 == 0) {
        const std::string key = quoted_after(s.turns[t].input, "Key: \"");
        CHECK(kv[key] == s.turns[t].answers[0]);
      } else {
        CHECK(s.turns[t].input.rfind("What is the", 0) == 0);
        CHECK(s.turns[t].answers[0].size() == 4);  // digits=4 passed through to math_find
      }
    }
  }
}

TEST_CASE("generator errors name the task and the knob", "[unit]") {
  using Catch::Matchers::Contains;
  CHECK_THAT(error_of(opts("retr_nope")), Contains("unknown task 'retr_nope'") && Contains("retr_kv"));
  CHECK_THAT(error_of(opts("retr_kv", 1500, 5, 1, {{"hops", "2"}})),
             Contains("task retr_kv") && Contains("unknown knob 'hops'") && Contains("key_length"));
  CHECK_THAT(error_of(opts("retr_kv", 1500, 5, 1, {{"key_length", "abc"}})),
             Contains("knob key_length must be an integer"));
  CHECK_THAT(error_of(opts("retr_kv", 1500, 5, 1, {{"key_length", "34"}})), Contains("key_length"));
  CHECK_THAT(error_of(opts("multihop_vt", 1500, 5, 1, {{"hops", "0"}})),
             Contains("task multihop_vt") && Contains("knob hops"));
  CHECK_THAT(error_of(opts("multihop_vt", 1500, 5, 1, {{"chains", "3"}})),
             Contains("knob chains 3 is fewer than the 5 turns"));
  CHECK_THAT(error_of(opts("math_find", 1500, 6)), Contains("task math_find: turns 6"));
  CHECK_THAT(error_of(opts("retr_kv", 60)),
             Contains("task retr_kv: context_tokens 60 is too small for 5 turns"));
  CHECK_THAT(error_of(opts("retr_prefix_suffix", 100)), Contains("too small"));
  // Prefix and suffix that make up the whole string would not need the context.
  CHECK_THAT(error_of(opts("retr_prefix_suffix", 1500, 5, 1,
                           {{"string_length", "8"}, {"affix_length", "4"}})),
             Contains("knob affix_length must be an integer in [1, 3]"));
  CHECK_THAT(error_of(opts("retr_kv", 1500, 0)), Contains("turns must be"));
  CHECK_THAT(error_of(opts("retr_kv", 0)), Contains("context_tokens must be"));
  GeneratorOptions no_samples = opts("math_find");
  no_samples.samples = 0;
  CHECK_THAT(error_of(no_samples), Contains("samples must be"));
  CHECK_THAT(error_of(opts("mix", 1500, 5, 1, {{"tasks", "retr_kv+retr_kv"}})),
             Contains("task mix: knob tasks"));
  CHECK_THAT(error_of(opts("mix", 1500, 5, 1, {{"tasks", "retr_kv"}})), Contains("knob tasks"));
  CHECK_THAT(error_of(opts("mix", 1500, 5, 1, {{"nope", "1"}})), Contains("unknown knob 'nope'"));
  CHECK_THAT(error_of(opts("mix", 250)),
             Contains("task mix: task retr_kv: context_tokens 125 is too small") &&
                 Contains("half of context_tokens 250"));
  CHECK_THAT(error_of(opts("mix", 1500, 5, 1, {{"key_length", "3"}})),
             Contains("task mix: task retr_kv: knob key_length"));
}

namespace {

bool same_sample(const Sample& a, const Sample& b) {
  if (a.id != b.id || a.task != b.task || a.context != b.context || a.documents != b.documents ||
      a.lang != b.lang || a.repo != b.repo || a.turns.size() != b.turns.size()) {
    return false;
  }
  for (size_t i = 0; i < a.turns.size(); ++i) {
    const SampleTurn &x = a.turns[i], &y = b.turns[i];
    if (x.input != y.input || x.answers != y.answers || x.reference != y.reference ||
        x.options != y.options || x.task != y.task) {
      return false;
    }
  }
  return true;
}

}  // namespace

// `kvbench list tasks --export`: a generated sample written as a JSONL line and read back is
// the same sample, text for text, so another tool (and `kvbench session`) sees exactly what
// a sweep feeds the model.
TEST_CASE("generated samples survive SCBench JSONL, every field", "[unit]") {
  for (const char* task : kTasks) {
    INFO(task);
    std::vector<Sample> made = generate_samples(opts(task, 700), tiny_tokenizer());
    std::string text;
    for (Sample& s : made) {
      s.task = task;
      text += sample_jsonl_line(s) + "\n";
    }
    std::istringstream in(text);
    const std::vector<Sample> read = parse_samples_jsonl(in, "exported.jsonl");
    REQUIRE(read.size() == made.size());
    for (size_t i = 0; i < made.size(); ++i) CHECK(same_sample(made[i], read[i]));
  }
  // The fields no generated task above sets: several answers, options, a reference, a
  // turn's task, lang and repo, and text that is not ASCII.
  Sample s;
  s.id = "x-1";
  s.task = "mix";
  s.context = "caf\xC3\xA9 \"quoted\"\n\ttab";
  s.lang = "python";
  s.repo = "r";
  SampleTurn turn;
  turn.input = "which?";
  turn.answers = {"a", "b"};
  turn.reference = "a, b";
  turn.options = {"one", "two", "three", "four"};
  turn.task = "retr_kv";
  s.turns = {turn, turn};
  s.turns[1].answers = {"only"};
  std::istringstream in(sample_jsonl_line(s) + "\n");
  const std::vector<Sample> read = parse_samples_jsonl(in, "exported.jsonl");
  REQUIRE(read.size() == 1);
  CHECK(same_sample(s, read[0]));
}
