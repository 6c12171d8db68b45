#include "datasets/python_source.h"

#include <cctype>
#include <sstream>

namespace kvbench {

namespace {

enum class Kind { name, string, comment, newline, open, close, other };

struct Token {
  Kind kind;
  size_t begin, end;  // [begin, end) in the source
};

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// A string prefix: r, b, u, f and their pairs, any case.
bool is_string_prefix(const std::string& s, size_t begin, size_t end) {
  if (end - begin > 2) return false;
  for (size_t i = begin; i < end; ++i) {
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
    if (c != 'r' && c != 'b' && c != 'u' && c != 'f') return false;
  }
  return true;
}

// The end of the string literal whose quote is at `q`.
size_t string_end(const std::string& s, size_t q) {
  const char quote = s[q];
  const bool triple = q + 2 < s.size() && s[q + 1] == quote && s[q + 2] == quote;
  size_t i = q + (triple ? 3 : 1);
  while (i < s.size()) {
    if (s[i] == '\\') {
      i += 2;
    } else if (triple && s.compare(i, 3, std::string(3, quote)) == 0) {
      return i + 3;
    } else if (!triple && (s[i] == quote || s[i] == '\n')) {
      return i + 1;
    } else {
      ++i;
    }
  }
  return s.size();
}

std::vector<Token> lex(const std::string& s) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '#') {
      const size_t e = s.find('\n', i);
      out.push_back({Kind::comment, i, e == std::string::npos ? s.size() : e});
      i = out.back().end;
    } else if (c == '\n') {
      out.push_back({Kind::newline, i, i + 1});
      ++i;
    } else if (c == '\\' && i + 1 < s.size() && s[i + 1] == '\n') {
      i += 2;  // a line continuation: no newline token
    } else if (is_name_start(c)) {
      size_t e = i;
      while (e < s.size() && is_name_char(s[e])) ++e;
      if (e < s.size() && (s[e] == '\'' || s[e] == '"') && is_string_prefix(s, i, e)) {
        out.push_back({Kind::string, i, string_end(s, e)});
      } else {
        out.push_back({Kind::name, i, e});
      }
      i = out.back().end;
    } else if (c == '\'' || c == '"') {
      out.push_back({Kind::string, i, string_end(s, i)});
      i = out.back().end;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = i;
      while (e < s.size() && (is_name_char(s[e]) || s[e] == '.')) ++e;
      out.push_back({Kind::other, i, e});
      i = e;
    } else if (c == '(' || c == '[' || c == '{') {
      out.push_back({Kind::open, i, i + 1});
      ++i;
    } else if (c == ')' || c == ']' || c == '}') {
      out.push_back({Kind::close, i, i + 1});
      ++i;
    } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f') {
      ++i;
    } else {
      out.push_back({Kind::other, i, i + 1});
      ++i;
    }
  }
  return out;
}

// A logical line: its tokens [first, last) (newlines and comments excluded) and the source
// offset just past its ending newline.
struct LogicalLine {
  size_t first, last;
  size_t end;
};

std::vector<LogicalLine> logical_lines(const std::string& s, const std::vector<Token>& tokens) {
  std::vector<LogicalLine> lines;
  int depth = 0;
  size_t first = std::string::npos, last = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const Token& tok = tokens[t];
    if (tok.kind == Kind::comment) continue;
    if (tok.kind == Kind::newline) {
      if (depth == 0 && first != std::string::npos) {
        lines.push_back({first, last, tok.end});
        first = std::string::npos;
      }
      continue;
    }
    if (tok.kind == Kind::open) ++depth;
    if (tok.kind == Kind::close && depth > 0) --depth;
    if (first == std::string::npos) first = t;
    last = t + 1;
  }
  if (first != std::string::npos) lines.push_back({first, last, s.size()});
  return lines;
}

bool at_column_zero(const std::string& s, size_t offset) {
  return offset == 0 || s[offset - 1] == '\n';
}

std::string word(const std::string& s, const Token& t) {
  return s.substr(t.begin, t.end - t.begin);
}

size_t line_start(const std::string& s, size_t offset) {
  const size_t nl = offset == 0 ? std::string::npos : s.rfind('\n', offset - 1);
  return nl == std::string::npos ? 0 : nl + 1;
}

// The text of a string literal token without its prefix and quotes.
std::string literal_text(const std::string& s, const Token& t) {
  size_t q = t.begin;
  while (q < t.end && s[q] != '\'' && s[q] != '"') ++q;
  const char quote = s[q];
  const size_t n = (q + 2 < t.end && s[q + 1] == quote && s[q + 2] == quote) ? 3 : 1;
  if (t.end < q + 2 * n) return "";
  return s.substr(q + n, t.end - n - q - n);
}

}  // namespace

std::vector<PythonBlock> top_level_blocks(const std::string& source) {
  const std::vector<Token> tokens = lex(source);
  const std::vector<LogicalLine> lines = logical_lines(source, tokens);
  // Block starts: top-level statements, moved up over the decorators and comment lines
  // above them.
  struct Start {
    size_t offset;  // where the block's text starts
    size_t line;    // its statement's logical line
  };
  std::vector<Start> starts;
  for (size_t l = 0; l < lines.size(); ++l) {
    const Token& head = tokens[lines[l].first];
    if (!at_column_zero(source, head.begin)) continue;
    const std::string w = word(source, head);
    if (head.kind == Kind::name &&
        (w == "else" || w == "elif" || w == "except" || w == "finally")) {
      continue;
    }
    if (head.kind == Kind::other && w == "@") continue;  // a decorator: the def below starts
    size_t offset = head.begin;
    // Decorators just above belong to this statement.
    for (size_t p = l; p > 0; --p) {
      const Token& above = tokens[lines[p - 1].first];
      if (!(above.kind == Kind::other && word(source, above) == "@" &&
            at_column_zero(source, above.begin))) {
        break;
      }
      offset = above.begin;
    }
    // And so do comment lines at column 0 directly above (no blank line between).
    while (offset > 0) {
      const size_t prev = line_start(source, offset - 1);
      const std::string text = source.substr(prev, offset - 1 - prev);
      if (text.empty() || text[0] != '#') break;
      offset = prev;
    }
    if (!starts.empty() && offset <= starts.back().offset) continue;
    starts.push_back({offset, l});
  }
  std::vector<PythonBlock> blocks;
  if (starts.empty() || starts[0].offset > 0) {
    PythonBlock lead;
    lead.text = source.substr(0, starts.empty() ? source.size() : starts[0].offset);
    if (!lead.text.empty()) blocks.push_back(lead);
  }
  for (size_t b = 0; b < starts.size(); ++b) {
    const size_t begin = starts[b].offset;
    const size_t end = b + 1 < starts.size() ? starts[b + 1].offset : source.size();
    PythonBlock block;
    block.text = source.substr(begin, end - begin);
    const LogicalLine& header = lines[starts[b].line];
    size_t t = header.first;
    if (word(source, tokens[t]) == "async" && t + 1 < header.last) ++t;
    if (tokens[t].kind == Kind::name && word(source, tokens[t]) == "def" && t + 1 < header.last &&
        tokens[t + 1].kind == Kind::name) {
      block.def_name = word(source, tokens[t + 1]);
      // A docstring: the next logical line is a lone string, indented, inside the block.
      // (A header ending in ':' has nothing after it on its line.)
      const bool body_below = source[tokens[header.last - 1].begin] == ':';
      const size_t next = starts[b].line + 1;
      if (body_below && next < lines.size() && lines[next].last == lines[next].first + 1) {
        const Token& doc = tokens[lines[next].first];
        if (doc.kind == Kind::string && doc.begin < end && !at_column_zero(source, doc.begin)) {
          block.docstring_begin = line_start(source, doc.begin) - begin;
          block.docstring_end = std::min(lines[next].end, end) - begin;
          block.docstring = literal_text(source, doc);
        }
      }
    }
    blocks.push_back(std::move(block));
  }
  return blocks;
}

std::string without_docstring(const PythonBlock& block) {
  if (block.docstring_begin == std::string::npos) return block.text;
  return block.text.substr(0, block.docstring_begin) + block.text.substr(block.docstring_end);
}

std::string docstring_summary(const std::string& docstring) {
  std::istringstream in(docstring);
  std::string line, out;
  bool started = false;
  while (std::getline(in, line)) {
    const bool blank = line.find_first_not_of(" \t\r") == std::string::npos;
    if (blank && started) break;
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      out += (out.empty() ? "" : " ") + w;
      started = true;
    }
  }
  return out;
}

std::string rename_identifiers(const std::string& code,
                               const std::map<std::string, std::string>& names) {
  std::string out;
  size_t copied = 0;
  for (const Token& t : lex(code)) {
    std::string replacement;
    if (t.kind == Kind::name) {
      auto it = names.find(word(code, t));
      if (it == names.end()) continue;
      replacement = it->second;
    } else if (t.kind == Kind::string) {
      const std::string inner = literal_text(code, t);
      auto it = names.find(inner);
      if (it == names.end()) continue;
      const std::string whole = word(code, t);
      replacement = whole;
      replacement.replace(whole.find(inner), inner.size(), it->second);
    } else {
      continue;
    }
    out.append(code, copied, t.begin - copied);
    out += replacement;
    copied = t.end;
  }
  out.append(code, copied, std::string::npos);
  return out;
}

bool has_identifier(const std::string& text, const std::string& w) {
  for (size_t at = text.find(w); at != std::string::npos; at = text.find(w, at + 1)) {
    const bool left = at == 0 || !is_name_char(text[at - 1]);
    const bool right = at + w.size() == text.size() || !is_name_char(text[at + w.size()]);
    if (left && right) return true;
  }
  return false;
}

}  // namespace kvbench
