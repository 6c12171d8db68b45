#include "datasets/corpus.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/input_error.h"
#include "common/sha256.h"

namespace kvbench {

const std::vector<CorpusInfo>& corpus_registry() {
  // The sha256s are of the files setup unpacks (scripts/setup.sh checks the packages').
  static const std::vector<CorpusInfo> corpora = {
      {"gnu-standards",
       "Debian bookworm gnu-standards 2022.03.23-0.1 (standards.text, maintain.text)",
       "the GNU Coding Standards and Information for Maintainers of GNU Software, as plain "
       "text: 810 paragraphs of running English prose, about 35,000 words",
       {{"gnu-standards/standards.txt",
         "45dbac535b379e14cd79db92b3f1016345232b3b8fb4c93fa298bd9d331076c4"},
        {"gnu-standards/maintain.txt",
         "05489eb1a08546af070f1c64dbe5d4b58a7364c6b21ed43a33ec5eca2ce55d80"}}},
      {"more-itertools",
       "PyPI more-itertools 10.5.0 sdist (more_itertools/more.py, recipes.py)",
       "the Python source of more-itertools: about 45K tokens, 153 top-level functions, 116 "
       "with a docstring a turn can quote",
       {{"more-itertools/more_itertools/more.py",
         "4933aa2a6d31d4b05739c45388546ac791d39feb5e4b278f4ff128234d03072c"},
        {"more-itertools/more_itertools/recipes.py",
         "dc33e9349626dda80a2c4b8a7bee422a7fb016be13ee2353cba0b9a74ce3bb28"}}},
  };
  return corpora;
}

const CorpusInfo& prose_corpus_info() { return corpus_registry()[0]; }
const CorpusInfo& code_corpus_info() { return corpus_registry()[1]; }

std::string corpus_dir() {
  const char* env = std::getenv("KVBENCH_CORPORA");
  if (env != nullptr && *env != '\0') return env;
  return std::string(KVBENCH_SOURCE_DIR) + "/corpora";
}

namespace {

// A pinned file's bytes, checked against its sha256.
std::string read_pinned(const CorpusInfo& corpus, const CorpusFile& file) {
  const std::string path = corpus_dir() + "/" + file.path;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(path + ": corpus " + corpus.name +
                     " is not there (scripts/setup.sh fetches it from " + corpus.source + ")");
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::string bytes = text.str();
  Sha256 sha;
  sha.update(bytes.data(), bytes.size());
  if (sha.hex_digest() != file.sha256) {
    throw InputError(path + ": corpus " + corpus.name + " has the wrong sha256 (expected " +
                     file.sha256 + "; run scripts/setup.sh again)");
  }
  return bytes;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

bool is_underline(const std::string& line) {
  if (line.size() < 3) return false;
  const char c = line[0];
  if (c != '=' && c != '-' && c != '*' && c != '.') return false;
  for (char x : line) {
    if (x != c) return false;
  }
  return true;
}

size_t leading_spaces(const std::string& line) {
  size_t n = 0;
  while (n < line.size() && line[n] == ' ') ++n;
  return n;
}

// One kept paragraph, or "" when it is not running text.
std::string running_text(const std::vector<std::string>& lines) {
  std::string joined;
  for (const std::string& line : lines) {
    const size_t indent = leading_spaces(line);
    if (is_underline(line) || indent >= 5 || line.compare(indent, 2, "* ") == 0) return "";
    std::istringstream words(line);
    std::string word;
    while (words >> word) joined += (joined.empty() ? "" : " ") + word;
  }
  size_t words = 1, letters = 0;
  for (char c : joined) {
    words += c == ' ';
    letters += std::isalpha(static_cast<unsigned char>(c)) != 0;
  }
  if (words < 12 || letters < joined.size() * 7 / 10) return "";
  return joined;
}

}  // namespace

std::vector<std::string> prose_paragraphs(const std::string& text) {
  std::vector<std::string> out, block;
  auto flush = [&] {
    if (!block.empty()) {
      std::string p = running_text(block);
      if (!p.empty()) out.push_back(std::move(p));
    }
    block.clear();
  };
  for (const std::string& line : split_lines(text)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      flush();
    } else {
      block.push_back(line);
    }
  }
  flush();
  return out;
}

const ProseCorpus& pinned_prose_corpus() {
  static const ProseCorpus corpus = [] {
    const CorpusInfo& info = prose_corpus_info();
    ProseCorpus c;
    c.name = info.name;
    for (const CorpusFile& file : info.files) {
      for (std::string& p : prose_paragraphs(read_pinned(info, file))) {
        c.paragraphs.push_back(std::move(p));
      }
    }
    return c;
  }();
  return corpus;
}

const CodeCorpus& pinned_code_corpus() {
  static const CodeCorpus corpus = [] {
    const CorpusInfo& info = code_corpus_info();
    CodeCorpus c;
    c.name = info.name;
    for (const CorpusFile& file : info.files) {
      // Named as the package lays it out: "more_itertools/more.py".
      const size_t slash = file.path.find('/');
      c.files.push_back({file.path.substr(slash + 1), read_pinned(info, file)});
    }
    return c;
  }();
  return corpus;
}

}  // namespace kvbench
