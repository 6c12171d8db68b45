// The natural tasks cut from corpora (niah over prose, repoqa over Python) with small
// corpora made here and the tiny GGUF's tokenizer: seeded byte-identical output, sizing,
// needles at the stated depths, docstrings removed, renamed identifiers consistent; and the
// Python reader they stand on. The pinned corpora with the real tokenizer are in
// test_generators_model.cpp.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/input_error.h"
#include "datasets/corpus.h"
#include "datasets/generator.h"
#include "datasets/python_source.h"
#include "gguf_writer.h"
#include "harness/model/gguf.h"
#include "harness/model/tokenizer.h"
#include "tasks/scorers.h"
#include "tasks/task_catalog.h"

using namespace kvbench;

namespace {

const Tokenizer& tiny_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    const std::string path = testing::temp_path("tiny_corpus_tasks.gguf");
    testing::write_tiny_llama_gguf(path, testing::TinyLlamaSpec{});
    GgufFile file(path);
    return std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
  }();
  return *tok;
}

// Sixty paragraphs of five sentences, each sentence naming its place.
const ProseCorpus& test_prose() {
  static const ProseCorpus corpus = [] {
    ProseCorpus c{"test-prose", {}};
    for (int p = 0; p < 60; ++p) {
      std::string text;
      for (int s = 0; s < 5; ++s) {
        text += (s ? " " : "") + std::string("Paragraph ") + std::to_string(p) +
                " says in sentence " + std::to_string(s) + " that the river runs to the sea.";
      }
      c.paragraphs.push_back(text);
    }
    return c;
  }();
  return corpus;
}

// A module of forty documented functions (each calling the one before), a decorated one, a
// class, comments, and a string holding what looks like a def at column 0.
std::string test_module() {
  std::string m =
      "\"\"\"A test module.\"\"\"\nimport itertools\n\n__all__ = ['step_0', 'step_1']\n\n";
  for (int i = 0; i < 40; ++i) {
    const std::string name = "step_" + std::to_string(i);
    m += "# helper " + std::to_string(i) + "\n";
    if (i == 7) m += "@functools.lru_cache(maxsize=None)\n";
    m += "def " + name + "(values, count=" + std::to_string(i) + "):\n";
    m += "    \"\"\"Return the values shifted by " + std::to_string(i) +
         " places and counted twice over.\n\n    More text on step_" + std::to_string(i) +
         " here.\n    \"\"\"\n";
    m += "    total = [v + count for v in values]  # step_0 in a comment\n";
    if (i > 0) m += "    total = step_" + std::to_string(i - 1) + "(total)\n";
    m += "    return total\n\n\n";
  }
  m += "TEMPLATE = '''\ndef not_a_block():\n    pass\n'''\n\n\n";
  m += "class Holder:\n    \"\"\"Holds values.\"\"\"\n\n    def get(self):\n        return "
       "step_3([1])\n";
  return m;
}

const CodeCorpus& test_code() {
  static const CodeCorpus corpus{"test-code", {{"pkg/mod.py", test_module()}}};
  return corpus;
}

GeneratorOptions opts(const std::string& task, int64_t tokens, uint64_t seed = 3,
                      std::map<std::string, std::string> knobs = {}) {
  GeneratorOptions o;
  o.task = task;
  o.context_tokens = tokens;
  o.turns = 5;
  o.samples = 2;
  o.seed = seed;
  o.knobs = std::move(knobs);
  o.prose = &test_prose();
  o.code = &test_code();
  return o;
}

std::string error_of(const GeneratorOptions& o) {
  try {
    generate_samples(o, tiny_tokenizer());
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("python_source: top-level blocks, docstrings and renaming", "[unit]") {
  const std::string m = test_module();
  const std::vector<PythonBlock> blocks = top_level_blocks(m);
  std::string joined;
  std::vector<std::string> defs;
  for (const PythonBlock& b : blocks) {
    joined += b.text;
    if (!b.def_name.empty()) defs.push_back(b.def_name);
  }
  CHECK(joined == m);          // the blocks are the file, cut
  REQUIRE(defs.size() == 40);  // not_a_block is in a string; get is a method
  CHECK(defs[0] == "step_0");
  CHECK(defs[39] == "step_39");
  for (const PythonBlock& b : blocks) {
    if (b.def_name == "step_7") {
      CHECK(b.text.rfind("# helper 7\n@functools.lru_cache(maxsize=None)\ndef step_7(", 0) == 0);
    }
    if (b.def_name.empty()) continue;
    CHECK(b.text.rfind("# helper ", 0) == 0);  // the comment above belongs to the def
    REQUIRE(b.docstring_begin != std::string::npos);
    const std::string without = without_docstring(b);
    CHECK(without.find("shifted by") == std::string::npos);
    CHECK(without.find("return total") != std::string::npos);
    CHECK(docstring_summary(b.docstring).rfind("Return the values shifted by ", 0) == 0);
    CHECK(docstring_summary(b.docstring).find("More text") == std::string::npos);
  }
  const std::string renamed =
      rename_identifiers(m, {{"step_0", "func_abcd"}, {"step_3", "func_wxyz"}});
  CHECK(count_of(renamed, "def step_3(") == 0);
  CHECK(count_of(renamed, "step_3(total)") == 0);  // the call in step_4
  CHECK(count_of(renamed, "func_wxyz(total)") == 1);
  CHECK(count_of(renamed, "def func_abcd(") == 1);
  CHECK(count_of(renamed, "total = func_abcd(total)") == 1);  // the call in step_1
  CHECK(count_of(renamed, "return func_wxyz([1])") == 1);     // a method's call
  CHECK(count_of(renamed, "['func_abcd', 'step_1']") == 1);   // an __all__ entry
  CHECK(count_of(renamed, "# step_0 in a comment") == 40);    // comments are left alone
  CHECK(count_of(renamed, "More text on step_0 here") == 1);  // and docstrings
  CHECK(has_identifier("a step_1(b)", "step_1"));
  CHECK_FALSE(has_identifier("a step_10(b)", "step_1"));
}

TEST_CASE("prose_paragraphs keeps running text only", "[unit]") {
  const std::string text =
      "Chapter One\n***********\n\n"
      "   This paragraph is running text of the manual, long enough to count as prose for the\n"
      "haystack, wrapped over two lines.\n\n"
      "     int main (void) { return 0; } and some more words to reach twelve words here\n\n"
      "* Menu:\n* Item one:: and more words here to make it long enough for the rule\n\n"
      "Too short.\n";
  const std::vector<std::string> p = prose_paragraphs(text);
  REQUIRE(p.size() == 1);
  CHECK(p[0] ==
        "This paragraph is running text of the manual, long enough to count as prose for the "
        "haystack, wrapped over two lines.");
}

TEST_CASE("niah and repoqa: seeded, byte-identical, sized within 2%", "[unit]") {
  for (const char* task : {"niah", "repoqa"}) {
    for (int64_t tokens : {1000, 3000}) {
      INFO(task << " at " << tokens);
      const auto a = generate_samples(opts(task, tokens), tiny_tokenizer());
      const auto b = generate_samples(opts(task, tokens), tiny_tokenizer());
      const auto c = generate_samples(opts(task, tokens, 4), tiny_tokenizer());
      REQUIRE(a.size() == 2);
      for (size_t i = 0; i < a.size(); ++i) {
        CHECK(a[i].context == b[i].context);
        REQUIRE(a[i].turns.size() == 5);
        for (size_t t = 0; t < 5; ++t) {
          CHECK(a[i].turns[t].input == b[i].turns[t].input);
          CHECK(a[i].turns[t].answers == b[i].turns[t].answers);
        }
        const int64_t n = count_context_tokens(tiny_tokenizer(), a[i].context);
        CHECK(std::abs(n - tokens) <= tokens * kContextTolerance);
      }
      CHECK(a[0].context != a[1].context);
      CHECK(a[0].context != c[0].context);
    }
  }
}

TEST_CASE("niah: every needle once, at its stated depth; distractors another kind", "[unit]") {
  const auto samples = generate_samples(
      opts("niah", 3000, 5, {{"depth_from", "50"}, {"depth_to", "50"}, {"distractors", "1"}}),
      tiny_tokenizer());
  // A needle's depth: its offset in the haystack with every needle taken out, over the
  // haystack's length without them.
  static const std::regex any_needle(
      "One of the special magic [a-z]+ for [a-z]+-[a-z]+ is: [0-9]+\\. ?");
  for (const Sample& s : samples) {
    const size_t hay = s.context.find('\n') + 1;
    std::string bare = s.context.substr(hay);
    std::map<std::string, size_t> bare_offset;  // needle text -> its offset in `bare`
    for (std::smatch m; std::regex_search(bare, m, any_needle);) {
      std::string text = m.str();
      while (!text.empty() && text.back() == ' ') text.pop_back();
      bare_offset[text] = static_cast<size_t>(m.position(0));
      bare.erase(static_cast<size_t>(m.position(0)), static_cast<size_t>(m.length(0)));
    }
    const double length = static_cast<double>(bare.size());
    for (const SampleTurn& t : s.turns) {
      const std::smatch key = [&] {
        std::smatch m;
        static const std::regex re("number for ([a-z]+-[a-z]+) mentioned");
        REQUIRE(std::regex_search(t.input, m, re));
        return m;
      }();
      const std::string needle =
          "special magic numbers for " + key[1].str() + " is: " + t.answers[0] + ".";
      REQUIRE(count_of(s.context, needle) == 1);
      REQUIRE(bare_offset.count("One of the " + needle) == 1);
      const double depth = static_cast<double>(bare_offset["One of the " + needle]) / length;
      CHECK(depth > 0.48);
      CHECK(depth < 0.52);
      const std::string distractor = "special magic codes for " + key[1].str() + " is: ";
      REQUIRE(count_of(s.context, distractor) == 1);
      const size_t at = s.context.find(distractor) + distractor.size();
      CHECK(s.context.substr(at, 7) != t.answers[0]);
      CHECK(t.answers[0].size() == 7);
    }
  }
  // Depth 0: the needles open the haystack; 100: they close it.
  for (const char* depth : {"0", "100"}) {
    const auto at = generate_samples(
        opts("niah", 1500, 1, {{"depth_from", depth}, {"depth_to", depth}}), tiny_tokenizer());
    const std::string& ctx = at[0].context;
    const size_t first = ctx.find("One of the special magic numbers");
    const size_t last = ctx.rfind("One of the special magic numbers");
    if (std::string(depth) == "0") {
      CHECK(first == ctx.find('\n') + 1);
    } else {
      CHECK(ctx.find('.', last + 40) + 1 >= ctx.size() - 80);  // within the last sentence or two
    }
  }
}

TEST_CASE("repoqa: docstrings removed, names renamed at the def and every use", "[unit]") {
  const auto samples = generate_samples(opts("repoqa", 3000), tiny_tokenizer());
  for (const Sample& s : samples) {
    for (const SampleTurn& t : s.turns) {
      const std::string name = t.answers[0];
      CHECK(std::regex_match(name, std::regex("func_[a-z]{4}")));
      CHECK(count_of(s.context, "def " + name + "(") == 1);
      // The quoted summary ("Return the values shifted by N places ...") is not in the context.
      const size_t q = t.input.find('"');
      const std::string summary = t.input.substr(q + 1, t.input.find('"', q + 1) - q - 1);
      CHECK(summary.rfind("Return the values shifted by ", 0) == 0);
      CHECK(s.context.find(summary) == std::string::npos);
    }
    // No original function name is left in code: every step_N is renamed.
    for (int i = 0; i < 40; ++i) {
      const std::string original = "step_" + std::to_string(i);
      CHECK(count_of(s.context, "def " + original + "(") == 0);
      CHECK(count_of(s.context, "= " + original + "(") == 0);
    }
    CHECK(s.context.find("# file: pkg/mod.py") != std::string::npos);
  }
  const auto plain = generate_samples(opts("repoqa", 3000, 3, {{"rename", "0"}}), tiny_tokenizer());
  for (const SampleTurn& t : plain[0].turns) {
    CHECK(t.answers[0].rfind("step_", 0) == 0);
    CHECK(count_of(plain[0].context, "def " + t.answers[0] + "(") == 1);
  }
}

TEST_CASE("repoqa_function: each turn's reference is its function as the context shows it",
          "[unit]") {
  const auto samples = generate_samples(opts("repoqa_function", 3000), tiny_tokenizer());
  const auto names = generate_samples(opts("repoqa", 3000), tiny_tokenizer());
  REQUIRE(samples.size() == names.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    CHECK(s.context == names[i].context);  // the same needles and code as repoqa
    for (size_t t = 0; t < s.turns.size(); ++t) {
      const std::string& function = s.turns[t].answers.at(0);
      INFO(function);
      CHECK(function.rfind("def " + names[i].turns[t].answers[0] + "(", 0) == 0);
      CHECK(count_of(s.context, function) == 1);
      CHECK(function.find('"') == std::string::npos);  // its docstring is gone
      CHECK(s.turns[t].input.find("repeat the exact described function") != std::string::npos);
      // The reply that repeats it in a fence passes; the name alone does not.
      CHECK(score(Scorer::function, "Here it is:\n```python\n" + function + "\n```\n",
                  s.turns[t].answers) == 1.0);
      CHECK(score(Scorer::function, names[i].turns[t].answers[0], s.turns[t].answers) == 0.0);
    }
  }
  CHECK(task_format("repoqa_function").scorer == Scorer::function);
}

TEST_CASE("niah and repoqa: bad knobs are one line naming the task", "[unit]") {
  CHECK(error_of(opts("niah", 1000, 3, {{"needles", "3"}})).find("task niah: knob needles 3") == 0);
  CHECK(error_of(opts("niah", 1000, 3, {{"depth_from", "60"}, {"depth_to", "40"}}))
            .find("task niah: knob depth_from 60 is after depth_to 40") == 0);
  CHECK(error_of(opts("repoqa", 1000, 3, {{"rename", "2"}})).find("task repoqa: knob rename") == 0);
  CHECK(error_of(opts("repoqa", 1000, 3, {{"functions", "99"}}))
            .find("is more than the 40 documented functions of corpus test-code") !=
        std::string::npos);
  CHECK(error_of(opts("repoqa_function", 1000, 3, {{"functions", "2"}}))
            .find("task repoqa_function: knob functions 2 is fewer") == 0);
  CHECK(error_of(opts("repoqa", 100000))
            .find("task repoqa: context_tokens 100000 is more than the corpus holds") !=
        std::string::npos);
}

TEST_CASE("the corpora's pinned sha256s: setup's manifest and kvbench's agree", "[unit]") {
  // scripts/setup.sh checks the unpacked files against datasets/corpora.sha256; kvbench
  // checks them against corpus_registry() when it reads them.
  std::ifstream in(std::string(KVBENCH_FIXTURES) + "/../../datasets/corpora.sha256");
  REQUIRE(in);
  std::map<std::string, std::string> manifest;
  std::string sha, path;
  while (in >> sha >> path) manifest[path] = sha;
  size_t files = 0;
  for (const CorpusInfo& corpus : corpus_registry()) {
    for (const CorpusFile& file : corpus.files) {
      INFO(file.path);
      CHECK(manifest[file.path] == file.sha256);
      ++files;
    }
  }
  CHECK(manifest.size() == files);
  CHECK(prose_corpus_info().name == "gnu-standards");
  CHECK(code_corpus_info().name == "more-itertools");
}
