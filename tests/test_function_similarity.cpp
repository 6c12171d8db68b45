// RepoQA's check of a repeated function: the reply's function cut out as RepoQA's
// sanitize_output does, and sentence BLEU against NLTK 3.10's own numbers (sentence_bleu with
// SmoothingFunction().method4, over re.split(r"\s+") tokens, as repoqa/metric.py calls it).
#include <catch2/catch.hpp>

#include <string>

#include "tasks/function_similarity.h"

using namespace kvbench;

namespace {

const std::string kReference =
    "def func_abcd(iterable, n):\n    it = iter(iterable)\n    return list(islice(it, n))";

}  // namespace

TEST_CASE("sentence_bleu4 matches NLTK's sentence_bleu with method4 smoothing", "[unit]") {
  struct Case {
    const char* name;
    std::string candidate;
    double nltk;
  };
  // Printed by nltk 3.10.4 (scratch virtualenv, not a dependency).
  const Case cases[] = {
      {"identical", kReference, 1.0},
      {"reindented",
       "def func_abcd(iterable, n):\n  it = iter(iterable)\n  return list(islice(it, n))", 1.0},
      {"one token changed",
       "def func_abcd(iterable, n):\n    it = iter(iterable)\n    return tuple(islice(it, n))",
       0.7506238537503395},
      {"renamed",
       "def func_wxyz(iterable, n):\n    it = iter(iterable)\n    return list(islice(it, n))",
       0.7506238537503395},
      {"truncated", "def func_abcd(iterable, n):\n    it = iter(iterable)", 0.6065306597126334},
      {"longer", kReference + "\n    # done\n    pass", 0.7102992180127422},
      {"one token", "def", 0.00033546262790251185},
      {"two tokens no bigram", "return def", 0.0024255817278165856},
      {"no overlap", "print('hello world')", 0.0},
      {"empty", "", 0.0},
      {"repeated tokens", "it it it it it it", 0.022801552518095385},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    CHECK(sentence_bleu4(c.candidate, kReference) == Approx(c.nltk).epsilon(1e-12).margin(1e-15));
  }
}

TEST_CASE("sanitize_function_reply cuts the function out as RepoQA does", "[unit]") {
  // No fence: the whole reply, trimmed.
  CHECK(sanitize_function_reply("  def f():\n    return 1\n\n") == "def f():\n    return 1");
  // The first fenced block's first function, without the prose and the call after it.
  CHECK(sanitize_function_reply("Sure:\n```python\nimport os\n\n@cache\ndef f(a,\nb):\n"
                                "    x = '''\nnot code\n'''\n    # note\n    return a\n"
                                "print(f(1, 2))\n```\nDone.") ==
        "def f(a,\nb):\n    x = '''\nnot code\n'''\n    # note\n    return a");
  // A method: from its def through the lines indented under it.
  CHECK(sanitize_function_reply("```\nclass A:\n    async def g(self):\n        pass\n\n"
                                "    def h(self): ...\n```") == "async def g(self):\n        pass");
  // No function in the first block: a later block's; none at all: the first block.
  CHECK(sanitize_function_reply("```text\nx = 1\n```\nthen\n```py\ndef k(): return 2\n```") ==
        "def k(): return 2");
  CHECK(sanitize_function_reply("```\nx = 1\n```\n```\ny = 2\n```") == "x = 1\n");
  // A fence must open a line and close at a line's start; an unclosed one is no fence.
  CHECK(sanitize_function_reply("say ```def f(): pass```") == "say ```def f(): pass```");
  CHECK(sanitize_function_reply("```python\ndef f(): pass") == "```python\ndef f(): pass");
}

TEST_CASE("function_match passes at RepoQA's similarity 0.8", "[unit]") {
  CHECK(function_match("```python\n" + kReference + "\n```", {kReference}) == 1.0);
  // One name changed in a short function is 0.75: below the threshold.
  CHECK(function_match("```python\n"
                       "def func_wxyz(iterable, n):\n    it = iter(iterable)\n"
                       "    return list(islice(it, n))\n```",
                       {kReference}) == 0.0);
  CHECK(function_match("func_abcd", {kReference}) == 0.0);
  CHECK(function_match(kReference, {}) == 0.0);
  CHECK(function_match(kReference, {"def other(): pass", kReference}) == 1.0);
}
