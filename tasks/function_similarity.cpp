#include "tasks/function_similarity.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace kvbench {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool line_start(std::string_view text, size_t at) { return at == 0 || text[at - 1] == '\n'; }

// The bodies of RepoQA's fences, re.findall(r"^```(?:\w+)?\s*\n(.*?)(?=^```)```", DOTALL |
// MULTILINE): an opening ``` at a line start, an optional word, whitespace up to its last
// newline; the body runs to the next ``` at a line start, which closes it.
std::vector<std::string_view> fenced_blocks(std::string_view text) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while ((at = text.find("```", at)) != std::string_view::npos) {
    if (!line_start(text, at)) {
      at += 1;
      continue;
    }
    size_t p = at + 3;
    while (p < text.size() && is_word(text[p])) ++p;
    size_t space_end = p;
    while (space_end < text.size() && is_space(text[space_end])) ++space_end;
    const size_t last_newline = text.rfind('\n', space_end == p ? p : space_end - 1);
    if (space_end == p || last_newline == std::string_view::npos || last_newline < p) {
      at += 1;  // no newline after the opening fence: not a fence here
      continue;
    }
    const size_t body = last_newline + 1;
    size_t close = body;
    while ((close = text.find("```", close)) != std::string_view::npos && !line_start(text, close))
      ++close;
    if (close == std::string_view::npos) {
      at += 1;
      continue;
    }
    out.push_back(text.substr(body, close - body));
    at = close + 3;
  }
  return out;
}

size_t indent_of(std::string_view line) {
  size_t i = 0;
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  return i;
}

// The first function of a block of Python, from `def` / `async def` to the end of its last
// line of code, or "" when the block has none. Lines inside brackets or a triple-quoted
// string continue the line before them; blank and comment-only lines do not end the body.
std::string_view first_function(std::string_view block) {
  size_t start = std::string_view::npos, def_indent = 0;
  for (size_t at = 0; at < block.size();) {
    const size_t nl = block.find('\n', at);
    const std::string_view line = block.substr(at, nl == std::string_view::npos ? nl : nl - at);
    const size_t ind = indent_of(line);
    const std::string_view code = line.substr(ind);
    if (code.rfind("def ", 0) == 0 || code.rfind("async def ", 0) == 0) {
      start = at + ind;
      def_indent = ind;
      break;
    }
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
  if (start == std::string_view::npos) return {};
  int depth = 0;
  char quote = 0;
  bool triple = false;
  size_t end = start;  // one past the last character of code seen
  for (size_t i = start; i < block.size(); ++i) {
    const char c = block[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote && (!triple || block.compare(i, 3, std::string(3, quote)) == 0)) {
        if (triple) i += 2;
        quote = 0;
      } else if (c == '\n' && !triple) {
        quote = 0;  // an unterminated one-line string ends with its line
      }
      end = i + 1;
      continue;
    }
    if (c == '#') {
      while (i + 1 < block.size() && block[i + 1] != '\n') ++i;
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
      triple = block.compare(i, 3, std::string(3, c)) == 0;
      if (triple) i += 2;
      end = i + 1;
      continue;
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
    if (c == '\n') {
      if (depth > 0) continue;
      // A logical line starts: it ends the function when it is code at the def's indent or
      // less.
      const size_t nl = block.find('\n', i + 1);
      const std::string_view line =
          block.substr(i + 1, nl == std::string_view::npos ? nl : nl - (i + 1));
      const size_t ind = indent_of(line);
      const std::string_view code = trim(line);
      if (!code.empty() && code.front() != '#' && ind <= def_indent) break;
      continue;
    }
    if (!is_space(c)) end = i + 1;
  }
  return block.substr(start, end - start);
}

std::vector<std::string_view> tokens_of(std::string_view text) {
  text = trim(text);
  std::vector<std::string_view> out;
  size_t at = 0;
  while (true) {
    size_t stop = at;
    while (stop < text.size() && !is_space(text[stop])) ++stop;
    out.push_back(text.substr(at, stop - at));
    if (stop >= text.size()) break;
    at = stop;
    while (at < text.size() && is_space(text[at])) ++at;
  }
  return out;
}

std::unordered_map<std::string, int> ngram_counts(const std::vector<std::string_view>& tokens,
                                                  size_t n) {
  std::unordered_map<std::string, int> counts;
  for (size_t i = 0; i + n <= tokens.size(); ++i) {
    std::string key;
    for (size_t j = 0; j < n; ++j) {
      key += tokens[i + j];
      key += ' ';  // tokens hold no whitespace, so ' ' separates them unambiguously
    }
    ++counts[key];
  }
  return counts;
}

}  // namespace

std::string sanitize_function_reply(std::string_view reply) {
  reply = trim(reply);
  const std::vector<std::string_view> blocks = fenced_blocks(reply);
  if (blocks.empty()) return std::string(reply);
  for (std::string_view block : blocks) {
    const std::string_view function = first_function(block);
    if (!function.empty()) return std::string(function);
  }
  return std::string(blocks.front());
}

double sentence_bleu4(std::string_view candidate, std::string_view reference) {
  const std::vector<std::string_view> hyp = tokens_of(candidate), ref = tokens_of(reference);
  constexpr int kOrders = 4;
  constexpr double kSmoothingK = 5;
  double numerators[kOrders], denominators[kOrders];
  for (size_t n = 1; n <= kOrders; ++n) {
    const auto hyp_counts = ngram_counts(hyp, n), ref_counts = ngram_counts(ref, n);
    int64_t matched = 0, total = 0;
    for (const auto& [gram, count] : hyp_counts) {
      total += count;
      const auto it = ref_counts.find(gram);
      if (it != ref_counts.end()) matched += std::min(count, it->second);
    }
    numerators[n - 1] = static_cast<double>(matched);
    denominators[n - 1] = static_cast<double>(std::max<int64_t>(1, total));
  }
  if (numerators[0] == 0) return 0.0;
  const double hyp_len = static_cast<double>(hyp.size()), ref_len = static_cast<double>(ref.size());
  double log_sum = 0;
  int smoothed = 1;
  for (int i = 0; i < kOrders; ++i) {
    double p = numerators[i] / denominators[i];
    if (numerators[i] == 0 && hyp.size() > 1) {
      p = 1.0 / (std::pow(2.0, smoothed) * kSmoothingK / std::log(hyp_len)) / denominators[i];
      ++smoothed;
    }
    if (p > 0) log_sum += 0.25 * std::log(p);  // NLTK skips a precision still at 0
  }
  const double brevity = hyp_len > ref_len ? 1.0 : std::exp(1.0 - ref_len / hyp_len);
  return brevity * std::exp(log_sum);
}

double function_similarity(std::string_view reply, std::string_view reference) {
  return sentence_bleu4(sanitize_function_reply(reply), reference);
}

double function_match(std::string_view reply, const std::vector<std::string>& answers) {
  for (const std::string& answer : answers) {
    if (function_similarity(reply, answer) >= kFunctionMatchThreshold) return 1.0;
  }
  return 0.0;
}

}  // namespace kvbench
