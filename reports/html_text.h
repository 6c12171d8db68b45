// Text from a results db as it goes into the reports: the HTML (also inside its SVG) and the
// Markdown. NUL and other control bytes never pass through.
#pragma once

#include <cstddef>
#include <string>

namespace kvbench {

// HTML text and attribute values: & < > " ' = escaped, and "://" written "&#58;//" so that a
// db string never puts a URL or an "onerror=" into the file's text (it reads the same). The
// one way a string from a db reaches the report's HTML and SVG.
std::string html_escape(const std::string& s);

// Markdown table cells: backslash-escapes the characters that end a cell or start emphasis,
// code or links, writes <, > and & as entities, and line breaks as spaces.
std::string markdown_escape(const std::string& s);

// At most `n` characters (UTF-8 aware), with an ellipsis when cut.
std::string truncate_text(const std::string& s, size_t n);

}  // namespace kvbench
