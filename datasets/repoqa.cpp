// repoqa: SCBench's Code.RepoQA over the pinned code corpus. The context is real source: the
// needle functions (top-level defs with a docstring) and, around them, the corpus's other
// top-level blocks in file order from a seeded start, each file under a `# file: <path>`
// line. Each turn quotes one needle's docstring (its first paragraph), which is removed from
// the context, and asks for the function's name. With `rename` (the default) every top-level
// function name of the corpus is replaced by a seeded neutral name (func_qzkt) at its def
// and every use in code, so the model cannot answer from memory of the library. The count
// of other blocks is the sized item; the first lines of the blocks after them pad.
// repoqa_function asks as SCBench does: repeat the described function, whose reference is
// its text as the context shows it (from `def`, renamed, without its docstring), scored by
// RepoQA's similarity (tasks/function_similarity.h).
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "datasets/generator_parts.h"
#include "datasets/python_source.h"

namespace kvbench::generator_parts {

namespace {

struct CorpusBlock {
  size_t file;
  PythonBlock block;
  std::string summary;  // a usable docstring's first paragraph, else ""
};

constexpr int64_t kPadLines = 400;
constexpr int64_t kMinSummaryWords = 6;

// Every top-level block of the corpus in file order, with the summaries a turn can quote:
// at least six words, not naming the function itself, and a body left once the docstring
// is removed.
std::vector<CorpusBlock> corpus_blocks(const CodeCorpus& corpus) {
  std::vector<CorpusBlock> out;
  for (size_t f = 0; f < corpus.files.size(); ++f) {
    for (PythonBlock& block : top_level_blocks(corpus.files[f].text)) {
      CorpusBlock cb{f, std::move(block), ""};
      if (!cb.block.def_name.empty() && !cb.block.docstring.empty()) {
        const std::string summary = docstring_summary(cb.block.docstring);
        const std::string rest = cb.block.text.substr(cb.block.docstring_end);
        const bool body_left = rest.find_first_not_of(" \t\r\n") != std::string::npos;
        size_t words = 1;
        for (char c : summary) words += c == ' ';
        if (words >= kMinSummaryWords && body_left && !has_identifier(summary, cb.block.def_name)) {
          cb.summary = summary;
        }
      }
      out.push_back(std::move(cb));
    }
  }
  return out;
}

// The first `lines` lines of a block's text.
std::string first_lines(const std::string& text, int64_t lines) {
  size_t cut = 0;
  for (int64_t l = 0; l < lines; ++l) {
    const size_t nl = text.find('\n', cut);
    if (nl == std::string::npos) return text;
    cut = nl + 1;
  }
  return text.substr(0, cut);
}

// A top-level function block's text from its `def` (or `async def`) line, without the
// decorators and comments before it and the blank lines after it.
std::string from_def_line(const std::string& text) {
  size_t at = 0;
  while (at < text.size() && text.compare(at, 4, "def ") != 0 &&
         text.compare(at, 10, "async def ") != 0) {
    const size_t nl = text.find('\n', at);
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  std::string out = text.substr(std::min(at, text.size()));
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace

Plan plan_repoqa(const Knobs& knobs, int32_t turns, uint64_t seed, const CodeCorpus& corpus,
                 RepoqaAnswer answer) {
  const char* task = answer == RepoqaAnswer::name ? "repoqa" : "repoqa_function";
  int64_t functions = knobs.integer("functions", 0, 100);
  const bool rename = knobs.integer("rename", 0, 1) == 1;
  if (functions == 0) functions = turns;
  if (functions < turns) {
    fail(task, "knob functions " + std::to_string(functions) + " is fewer than the " +
                       std::to_string(turns) + " turns (each turn asks a different function)");
  }
  const auto blocks = std::make_shared<std::vector<CorpusBlock>>(corpus_blocks(corpus));
  std::vector<int64_t> askable;
  std::set<std::string> def_names;
  for (size_t i = 0; i < blocks->size(); ++i) {
    if (!(*blocks)[i].summary.empty()) askable.push_back(static_cast<int64_t>(i));
    if (!(*blocks)[i].block.def_name.empty()) def_names.insert((*blocks)[i].block.def_name);
  }
  if (static_cast<int64_t>(askable.size()) < functions) {
    fail(task, "knob functions " + std::to_string(functions) + " is more than the " +
                       std::to_string(askable.size()) + " documented functions of corpus " +
                       corpus.name);
  }
  Rng pick(seed);
  std::vector<int64_t> needles;
  for (int64_t i : choose_distinct(pick, static_cast<int64_t>(askable.size()), functions)) {
    needles.push_back(askable[static_cast<size_t>(i)]);
  }
  const std::set<int64_t> needle_set(needles.begin(), needles.end());
  std::vector<int64_t> others;
  for (int64_t i = 0; i < static_cast<int64_t>(blocks->size()); ++i) {
    if (!needle_set.count(i)) others.push_back(i);
  }
  const int64_t start = static_cast<int64_t>(pick.below(others.size()));
  // Neutral names: func_ and four seeded letters, all distinct, one per def of the corpus.
  std::map<std::string, std::string> renames;
  if (rename) {
    std::set<std::string> used;
    for (const std::string& name : def_names) {
      std::string neutral;
      do {
        neutral = "func_" + random_string(pick, "abcdefghijklmnopqrstuvwxyz", 26, 4);
      } while (!used.insert(neutral).second || def_names.count(neutral));
      renames[name] = neutral;
    }
  }
  Plan plan;
  plan.task = task;
  plan.min_items = 0;
  plan.pad_max = kPadLines;
  plan.max_items = static_cast<int64_t>(others.size());
  plan.build = [=](int64_t n, int64_t pad) {
    const int64_t total = static_cast<int64_t>(others.size());
    std::vector<int64_t> chosen = needles;
    for (int64_t i = 0; i < n; ++i)
      chosen.push_back(others[static_cast<size_t>((start + i) % total)]);
    std::sort(chosen.begin(), chosen.end());
    std::string code;
    size_t file = std::string::npos;
    auto emit = [&](const CorpusBlock& cb, const std::string& text) {
      if (cb.file != file) {
        file = cb.file;
        if (!code.empty() && code.back() != '\n') code += "\n";
        code +=
            (code.empty() ? "" : "\n") + std::string("# file: ") + corpus.files[file].path + "\n";
      }
      code += text;
    };
    for (int64_t i : chosen) {
      const CorpusBlock& cb = (*blocks)[static_cast<size_t>(i)];
      emit(cb, needle_set.count(i) ? without_docstring(cb.block) : cb.block.text);
    }
    // Padding: the first `pad` lines of the blocks after the n-th (a block is coarser than 2%).
    for (int64_t i = n, left = pad; left > 0 && i < total; ++i) {
      const CorpusBlock& next =
          (*blocks)[static_cast<size_t>(others[static_cast<size_t>((start + i) % total)])];
      const std::string part = first_lines(next.block.text, left);
      emit(next, part);
      left -= static_cast<int64_t>(std::count(part.begin(), part.end(), '\n'));
      if (part.empty() || part.back() != '\n') break;
    }
    while (!code.empty() && (code.back() == '\n' || code.back() == ' ')) code.pop_back();
    if (rename) code = rename_identifiers(code, renames);
    Built b;
    b.context = "Below is the source code of a Python library.\n\n" + code;
    for (int64_t t = 0; t < turns; ++t) {
      const CorpusBlock& cb = (*blocks)[static_cast<size_t>(needles[static_cast<size_t>(t)])];
      if (answer == RepoqaAnswer::function) {
        // SCBench's RepoQA query (scbench_repoqa's template), the docstring as description.
        std::string function = from_def_line(without_docstring(cb.block));
        if (rename) function = rename_identifiers(function, renames);
        b.turns.push_back(make_turn(
            "Based on the function description and code context, please retrieve and repeat "
            "the exact described function from the code context in a code block wrapped by "
            "```:\n\nFunction description: " + cb.summary,
            {function}));
        continue;
      }
      const std::string name = rename ? renames.at(cb.block.def_name) : cb.block.def_name;
      b.turns.push_back(
          make_turn("A function in the code above is documented as follows:\n\"" + cb.summary +
                        "\"\nWhat is the name of that function? Answer with the name only.",
                    {name}));
    }
    return b;
  };
  return plan;
}

}  // namespace kvbench::generator_parts
