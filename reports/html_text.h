// Text from a results db as it goes into the HTML report (also inside its SVG).
#pragma once

#include <cstddef>
#include <string>

namespace kvbench {

// HTML text and attribute values: & < > " ' = escaped, and "://" written "&#58;//" so that a
// db string never puts a URL or an "onerror=" into the file's text (it reads the same). The
// one way a string from a db reaches the report's HTML and SVG.
std::string html_escape(const std::string& s);

// At most `n` characters (UTF-8 aware), with an ellipsis when cut.
std::string truncate_text(const std::string& s, size_t n);

}  // namespace kvbench
