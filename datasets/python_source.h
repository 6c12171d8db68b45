// Just enough of Python's lexical structure for repoqa: a file cut into its top-level
// blocks (a def with its decorators and comments, a class, an import, ...), a def's
// docstring, and identifiers renamed in code only. Strings, comments, brackets and line
// continuations are tracked so that a line at column 0 inside a string or a bracket does not
// start a block and a word inside a string or comment is not renamed.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kvbench {

struct PythonBlock {
  std::string text;      // the block's lines, with its trailing blank lines
  std::string def_name;  // a top-level `def` (or `async def`): its name; else ""
  // A def whose body starts with a string statement: its lines [begin, end) within text
  // (whole lines, the newline included) and its text with quotes and prefix removed.
  size_t docstring_begin = std::string::npos;
  size_t docstring_end = std::string::npos;
  std::string docstring;
};

// The file's top-level blocks, in order; their texts concatenate to the file. Decorators and
// comment lines belong to the statement after them; `else`, `elif`, `except` and `finally`
// at column 0 to the statement before.
std::vector<PythonBlock> top_level_blocks(const std::string& source);

// The block with its docstring's lines removed (the block itself without one).
std::string without_docstring(const PythonBlock& block);

// The first paragraph of a docstring, dedented, its words joined by single spaces.
std::string docstring_summary(const std::string& docstring);

// `code` with every identifier in `names` replaced by its new name, where it is code (not
// inside a string or a comment), and every string literal whose whole content is such a name
// (an `__all__` entry) likewise.
std::string rename_identifiers(const std::string& code,
                               const std::map<std::string, std::string>& names);

// Whether `word` occurs in `text` as a whole identifier ([A-Za-z0-9_] does not touch it).
bool has_identifier(const std::string& text, const std::string& word);

}  // namespace kvbench
