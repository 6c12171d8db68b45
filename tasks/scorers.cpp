// Scorers: see scorers.h for what each one does and where it differs from SCBench.
#include "tasks/scorers.h"

#include <algorithm>
#include <cmath>
#include <locale>
#include <map>
#include <sstream>

#include "common/input_error.h"
#include "tasks/function_similarity.h"

namespace kvbench {

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ascii_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_ascii_lower(char c) { return c >= 'a' && c <= 'z'; }
bool is_ascii_letter(char c) { return is_ascii_upper(c) || is_ascii_lower(c); }
bool is_ascii_alnum(char c) { return is_ascii_letter(c) || is_ascii_digit(c); }
// Python's string.punctuation.
bool is_ascii_punct(char c) {
  return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
         (c >= '{' && c <= '~');
}
char ascii_lower(char c) { return is_ascii_upper(c) ? static_cast<char>(c - 'A' + 'a') : c; }
char ascii_upper(char c) { return is_ascii_lower(c) ? static_cast<char>(c - 'a' + 'A') : c; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ascii_space(s[b])) ++b;
  while (e > b && is_ascii_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::vector<std::string> split_ws(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_ascii_space(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !is_ascii_space(s[j])) ++j;
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

bool has_non_ascii(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
}

// One decoded code point with its byte span.
struct Decoded {
  char32_t cp;
  size_t len;
  bool valid;
};

Decoded decode_one(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1, true};
  int n = 0;
  char32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) { n = 1; cp = b0 & 0x1F; }
  else if ((b0 & 0xF0) == 0xE0) { n = 2; cp = b0 & 0x0F; }
  else if ((b0 & 0xF8) == 0xF0) { n = 3; cp = b0 & 0x07; }
  else return {0xFFFD, 1, false};
  for (int k = 1; k <= n; ++k) {
    if (i + k >= s.size()) return {0xFFFD, 1, false};
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {0xFFFD, 1, false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, static_cast<size_t>(n + 1), true};
}

bool is_unicode_space(char32_t cp) {
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200B) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000 ||
         cp == 0xFEFF;
}

// Punctuation deleted by normalize_zh (beyond ASCII, which is tested separately).
bool is_zh_punct(char32_t cp) {
  if (cp == 0xA1 || cp == 0xAB || cp == 0xB7 || cp == 0xBB || cp == 0xBF) return true;
  if (cp >= 0x2010 && cp <= 0x2027) return true;  // dashes, quotes, bullets, ellipsis
  if (cp >= 0x2030 && cp <= 0x205E) return true;  // per mille, primes, ‹ ›, ※, ...
  if (cp >= 0x3001 && cp <= 0x3003) return true;  // 、。〃
  if (cp >= 0x3008 && cp <= 0x3011) return true;  // 〈〉《》「」『』【】
  if (cp >= 0x3014 && cp <= 0x301F) return true;  // 〔〕〖〗〘〙〚〛〜〝〞〟
  if (cp == 0x3030 || cp == 0x303D || cp == 0x303E || cp == 0x303F) return true;
  if (cp >= 0xFE10 && cp <= 0xFE19) return true;  // vertical forms
  if (cp >= 0xFE30 && cp <= 0xFE6B) return true;  // CJK compatibility and small forms
  if (cp >= 0xFF01 && cp <= 0xFF0F) return true;  // ！＂＃＄％＆＇（）＊＋，－．／
  if (cp >= 0xFF1A && cp <= 0xFF20) return true;  // ：；＜＝＞？＠
  if (cp >= 0xFF3B && cp <= 0xFF40) return true;  // ［＼］＾＿｀
  if (cp >= 0xFF5B && cp <= 0xFF65) return true;  // ｛｜｝～｟｠｡｢｣､･
  return false;
}

template <typename Token>
double multiset_f1(const std::vector<Token>& pred, const std::vector<Token>& gold) {
  if (pred.empty() || gold.empty()) return 0.0;
  std::map<Token, int> counts;
  for (const Token& t : gold) ++counts[t];
  int same = 0;
  for (const Token& t : pred) {
    auto it = counts.find(t);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0) return 0.0;
  const double precision = static_cast<double>(same) / pred.size();
  const double recall = static_cast<double>(same) / gold.size();
  return 2 * precision * recall / (precision + recall);
}

template <typename F>
double best_over(const Answers& answers, F&& f) {
  double best = 0.0;
  for (const std::string& a : answers) best = std::max(best, f(a));
  return best;
}

// A gold answer that is an option label: "B", "(B)", "b.", " [C] " -> "B".
std::optional<std::string> gold_label(std::string_view answer) {
  std::string_view s = trim(answer);
  if (!s.empty() && s.back() == '.') s = trim(s.substr(0, s.size() - 1));
  if (s.size() == 3 && ((s[0] == '(' && s[2] == ')') || (s[0] == '[' && s[2] == ']'))) {
    s = s.substr(1, 1);
  }
  if (s.size() == 1 && is_ascii_letter(s[0])) return std::string(1, ascii_upper(s[0]));
  return std::nullopt;
}

bool label_allowed(char upper, size_t n_options) {
  if (!is_ascii_upper(upper)) return false;
  return n_options == 0 || static_cast<size_t>(upper - 'A') < n_options;
}

// Whether `needle` tokens occur as a contiguous run in `hay` tokens.
bool contains_run(const std::vector<std::string>& hay, const std::vector<std::string>& needle) {
  if (needle.empty() || needle.size() > hay.size()) return false;
  for (size_t i = 0; i + needle.size() <= hay.size(); ++i) {
    if (std::equal(needle.begin(), needle.end(), hay.begin() + i)) return true;
  }
  return false;
}

// Strips surrounding quotes, markdown, and trailing punctuation from an extracted answer.
std::string clean_answer(std::string_view s) {
  static const std::vector<std::string> kQuotes = {"\"", "'", "`", "\u201C", "\u201D", "\u2018",
                                                   "\u2019", "\u00AB", "\u00BB", "**", "*"};
  bool changed = true;
  while (changed) {
    changed = false;
    s = trim(s);
    while (!s.empty() && std::string_view(".,;:!?").find(s.back()) != std::string_view::npos) {
      s.remove_suffix(1);
      changed = true;
    }
    for (const std::string& q : kQuotes) {
      if (s.size() >= q.size() && s.substr(0, q.size()) == q) {
        s.remove_prefix(q.size());
        changed = true;
      }
      if (s.size() >= q.size() && s.substr(s.size() - q.size()) == q) {
        s.remove_suffix(q.size());
        changed = true;
      }
    }
  }
  return std::string(s);
}

// First fenced ``` block's body, or the whole text.
std::string_view code_of(std::string_view text) {
  const size_t open = text.find("```");
  if (open == std::string_view::npos) return text;
  size_t body = text.find('\n', open);
  if (body == std::string_view::npos) return text.substr(open + 3);
  ++body;
  const size_t close = text.find("```", body);
  return text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body);
}

}  // namespace

// ---- Normalisation ------------------------------------------------------------------

std::string normalize_en(std::string_view text) {
  std::string no_punct;
  no_punct.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Decoded d = decode_one(text, i);
    if (d.len == 1) {
      if (!is_ascii_punct(text[i])) no_punct.push_back(ascii_lower(text[i]));
    } else if (d.valid && is_unicode_space(d.cp)) {
      no_punct.push_back(' ');
    } else if (!(d.valid && is_zh_punct(d.cp))) {
      no_punct.append(text.substr(i, d.len));
    }
    i += d.len;
  }
  std::string out;
  for (const std::string& w : split_ws(no_punct)) {
    if (w == "a" || w == "an" || w == "the") continue;
    if (!out.empty()) out.push_back(' ');
    out += w;
  }
  return out;
}

std::u32string utf8_code_points(std::string_view text) {
  std::u32string out;
  for (size_t i = 0; i < text.size();) {
    const Decoded d = decode_one(text, i);
    out.push_back(d.cp);
    i += d.len;
  }
  return out;
}

std::string normalize_zh(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Decoded d = decode_one(text, i);
    const bool drop = d.valid && ((d.cp < 0x80 && (is_ascii_space(static_cast<char>(d.cp)) ||
                                                   is_ascii_punct(static_cast<char>(d.cp)))) ||
                                  is_unicode_space(d.cp) || is_zh_punct(d.cp));
    if (!drop) {
      if (d.len == 1) out.push_back(ascii_lower(text[i]));
      else out.append(text.substr(i, d.len));
    }
    i += d.len;
  }
  return out;
}

// ---- Answer extraction ----------------------------------------------------------------

std::string extract_answer(std::string_view prediction) {
  std::string_view rest = trim(prediction);
  // 1. The first non-empty line.
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const std::string_view line = trim(rest.substr(0, nl));
    if (!line.empty() || nl == std::string_view::npos) {
      rest = line;
      break;
    }
    rest = trim(rest.substr(nl + 1));
  }
  static const std::vector<std::string> kCues = {"answer is", "answer:", "value is", "value:",
                                                 " is ", ": "};
  static const std::vector<std::pair<std::string, std::string>> kQuotePairs = {
      {"\"", "\""}, {"'", "'"}, {"`", "`"}, {"\u201C", "\u201D"}, {"\u2018", "\u2019"},
      {"\u00AB", "\u00BB"}};
  for (int round = 0; round < 8; ++round) {
    // 2. What follows the earliest cue (the longest cue on a tie).
    const std::string low = lower(rest);
    size_t at = std::string::npos, len = 0;
    for (const std::string& cue : kCues) {
      const size_t pos = low.find(cue);
      if (pos != std::string::npos && (pos < at || (pos == at && cue.size() > len))) {
        at = pos;
        len = cue.size();
      }
    }
    if (at == std::string::npos) break;
    rest = trim(rest.substr(at + len));
    // 3. A quoted answer, or the first clause.
    for (const auto& [open, close] : kQuotePairs) {
      if (rest.substr(0, open.size()) == open) {
        const size_t end = rest.find(close, open.size());
        if (end != std::string_view::npos) {
          return clean_answer(rest.substr(open.size(), end - open.size()));
        }
      }
    }
    size_t end = rest.size();
    for (const char* stop : {", ", "; ", ". ", "! ", "? "}) end = std::min(end, rest.find(stop));
    rest = rest.substr(0, end);
  }
  return clean_answer(rest);
}

std::optional<double> extract_number(std::string_view s, NumberPick pick) {
  std::optional<double> found;
  size_t i = 0;
  while (i < s.size()) {
    // A number starts at a digit, or ".digit", or a sign before either; never glued to a
    // preceding letter or digit.
    size_t start = i;
    bool negative = false;
    size_t sign_len = 0;
    if (s[i] == '-' || s[i] == '+') sign_len = 1;
    else if (s.substr(i, 3) == "\u2212") sign_len = 3;
    const size_t body = i + sign_len;
    const bool starts_digit = body < s.size() && is_ascii_digit(s[body]);
    const bool starts_dot = body + 1 < s.size() && s[body] == '.' && is_ascii_digit(s[body + 1]);
    const bool glued = start > 0 && (is_ascii_alnum(s[start - 1]) || (sign_len == 0 && s[start - 1] == '.'));
    if (!(starts_digit || starts_dot) || (sign_len > 0 && glued)) {
      ++i;
      continue;
    }
    if (glued) {
      // Skip the rest of this alphanumeric run ("a3f9", "v2.1").
      while (i < s.size() && (is_ascii_alnum(s[i]) || s[i] == '.')) ++i;
      continue;
    }
    negative = sign_len > 0 && s[i] != '+';
    size_t j = body;
    std::string digits;
    // Integer part with optional thousands groups.
    size_t int_begin = j;
    while (j < s.size() && is_ascii_digit(s[j])) digits.push_back(s[j++]);
    const size_t first_group = j - int_begin;
    if (first_group >= 1 && first_group <= 3) {
      while (j + 3 < s.size() && s[j] == ',' && is_ascii_digit(s[j + 1]) &&
             is_ascii_digit(s[j + 2]) && is_ascii_digit(s[j + 3]) &&
             !(j + 4 < s.size() && is_ascii_digit(s[j + 4]))) {
        digits.append(s.substr(j + 1, 3));
        j += 4;
      }
    }
    if (j + 1 < s.size() && s[j] == '.' && is_ascii_digit(s[j + 1])) {
      digits.push_back('.');
      ++j;
      while (j < s.size() && is_ascii_digit(s[j])) digits.push_back(s[j++]);
    }
    if (digits.empty() || digits == ".") {
      i = j + 1;
      continue;
    }
    std::istringstream in(digits.front() == '.' ? "0" + digits : digits);
    in.imbue(std::locale::classic());
    double value = 0;
    in >> value;
    if (negative) value = -value;
    if (pick == NumberPick::first) return value;
    found = value;
    i = j;
  }
  return found;
}

std::optional<std::string> extract_choice(std::string_view p,
                                          const std::vector<std::string>& options) {
  const size_t n_opt = options.size();
  const std::string low = lower(p);
  auto alnum_at = [&](size_t k) { return k < p.size() && is_ascii_alnum(p[k]); };

  // 1. Cue word, filler, label.
  struct Hit {
    size_t pos;
    char label;
  };
  std::optional<Hit> best;
  const std::vector<std::vector<std::string>> cue_groups = {{"answer"}, {"option", "choice"}};
  for (const std::vector<std::string>& group : cue_groups) {
    for (const std::string& c : group) {
      for (size_t at = low.find(c); at != std::string::npos; at = low.find(c, at + 1)) {
        if (at > 0 && is_ascii_letter(p[at - 1])) continue;
        size_t k = at + c.size();
        if (k < p.size() && low[k] == 's') ++k;  // "answers", "options"
        bool progressed = true;
        while (progressed) {
          progressed = false;
          while (k < p.size() && (is_ascii_space(p[k]) || p[k] == ':' || p[k] == '=' ||
                                  p[k] == '-' || p[k] == '*')) {
            ++k;
            progressed = true;
          }
          for (const char* filler : {"is", "would be", "should be"}) {
            const std::string f(filler);
            if (low.compare(k, f.size(), f) == 0 && !alnum_at(k + f.size())) {
              k += f.size();
              progressed = true;
            }
          }
        }
        bool bracket = false;
        if (k < p.size() && (p[k] == '(' || p[k] == '[')) {
          bracket = true;
          ++k;
        }
        if (k >= p.size()) continue;
        const char ch = bracket ? ascii_upper(p[k]) : p[k];
        if (!label_allowed(ch, n_opt) || alnum_at(k + 1)) continue;
        if (!best || at < best->pos) best = Hit{at, ch};
      }
    }
    if (best) return std::string(1, best->label);
  }

  // 2. A bracketed label anywhere.
  for (size_t k = 0; k + 2 < p.size(); ++k) {
    if ((p[k] == '(' && p[k + 2] == ')') || (p[k] == '[' && p[k + 2] == ']')) {
      const char ch = ascii_upper(p[k + 1]);
      if (label_allowed(ch, n_opt)) return std::string(1, ch);
    }
  }

  // 3. A label opening the prediction.
  {
    size_t k = 0;
    while (k < p.size() && (is_ascii_space(p[k]) || p[k] == '*' || p[k] == '"' || p[k] == '\'')) ++k;
    const bool contraction = k + 2 < p.size() && p[k + 1] == '\'' && is_ascii_letter(p[k + 2]);
    if (k < p.size() && label_allowed(p[k], n_opt) && !contraction) {
      const size_t n = k + 1;
      if (n == p.size() || std::string_view(".):,\n*\"'").find(p[n]) != std::string_view::npos ||
          trim(p.substr(n)).empty()) {
        return std::string(1, p[k]);
      }
    }
  }

  // 4. The text of exactly one option.
  if (n_opt > 0) {
    const std::vector<std::string> pred_tokens = split_ws(normalize_en(p));
    std::vector<size_t> found;
    std::vector<std::string> texts(n_opt);
    for (size_t o = 0; o < n_opt; ++o) {
      texts[o] = normalize_en(options[o]);
      if (contains_run(pred_tokens, split_ws(texts[o]))) found.push_back(o);
    }
    std::vector<size_t> maximal;
    for (size_t o : found) {
      bool inside_other = false;
      for (size_t other : found) {
        if (other != o && texts[other] != texts[o] &&
            (" " + texts[other] + " ").find(" " + texts[o] + " ") != std::string::npos) {
          inside_other = true;
        }
      }
      if (!inside_other) maximal.push_back(o);
    }
    if (maximal.size() == 1) return std::string(1, static_cast<char>('A' + maximal[0]));
  }

  // 5. Exactly one distinct lone capital letter.
  std::optional<char> lone;
  for (size_t k = 0; k < p.size(); ++k) {
    if (!label_allowed(p[k], n_opt)) continue;
    if ((k > 0 && is_ascii_alnum(p[k - 1])) || alnum_at(k + 1)) continue;
    if ((p[k] == 'A' || p[k] == 'I') && k + 2 < p.size() && p[k + 1] == ' ' &&
        is_ascii_lower(p[k + 2])) {
      continue;  // the English words "A" and "I"
    }
    if (k + 2 < p.size() && p[k + 1] == '\'' && is_ascii_letter(p[k + 2])) continue;  // "I'm"
    if (lone && *lone != p[k]) return std::nullopt;
    lone = p[k];
  }
  if (lone) return std::string(1, *lone);
  return std::nullopt;
}

// ---- Metrics ----------------------------------------------------------------------------

double exact_match(std::string_view prediction, const Answers& answers) {
  const std::string pred = normalize_en(prediction);
  const std::string extracted = extract_answer(prediction);
  const std::string ext = normalize_en(extracted);
  return best_over(answers, [&](const std::string& a) {
    const std::string gold = normalize_en(a);
    if (!gold.empty() && (pred == gold || ext == gold)) return 1.0;
    if (has_non_ascii(a)) {
      const std::string gz = normalize_zh(a);
      if (!gz.empty() && (normalize_zh(prediction) == gz || normalize_zh(extracted) == gz)) {
        return 1.0;
      }
    }
    return 0.0;
  });
}

double contains(std::string_view prediction, const Answers& answers) {
  const std::vector<std::string> pred_tokens = split_ws(normalize_en(prediction));
  return best_over(answers, [&](const std::string& a) {
    if (contains_run(pred_tokens, split_ws(normalize_en(a)))) return 1.0;
    if (has_non_ascii(a)) {
      const std::string gz = normalize_zh(a);
      if (!gz.empty() && normalize_zh(prediction).find(gz) != std::string::npos) return 1.0;
    }
    return 0.0;
  });
}

double contains_all(std::string_view prediction, const Answers& answers) {
  if (answers.empty()) return 0.0;
  double found = 0;
  for (const std::string& a : answers) found += contains(prediction, {a});
  return found / static_cast<double>(answers.size());
}

double token_f1(std::string_view prediction, const Answers& answers) {
  const std::vector<std::string> pred = split_ws(normalize_en(prediction));
  return best_over(answers, [&](const std::string& a) {
    return multiset_f1(pred, split_ws(normalize_en(a)));
  });
}

double char_f1(std::string_view prediction, const Answers& answers) {
  const std::u32string p = utf8_code_points(normalize_zh(prediction));
  const std::vector<char32_t> pred(p.begin(), p.end());
  return best_over(answers, [&](const std::string& a) {
    const std::u32string g = utf8_code_points(normalize_zh(a));
    return multiset_f1(pred, std::vector<char32_t>(g.begin(), g.end()));
  });
}

double multiple_choice(std::string_view prediction, const Answers& answers,
                       const std::vector<std::string>& options) {
  const std::optional<std::string> chosen = extract_choice(prediction, options);
  return best_over(answers, [&](const std::string& a) {
    std::optional<std::string> gold = gold_label(a);
    if (!gold && !options.empty()) {
      const std::string text = normalize_en(a);
      for (size_t o = 0; o < options.size(); ++o) {
        if (normalize_en(options[o]) == text) {
          gold = std::string(1, static_cast<char>('A' + o));
          break;
        }
      }
    }
    if (!gold) return exact_match(prediction, {a});
    return chosen && *chosen == *gold ? 1.0 : 0.0;
  });
}

double numeric_match(std::string_view prediction, const Answers& answers) {
  const std::optional<double> pred = extract_number(prediction, NumberPick::first);
  if (!pred) return 0.0;
  return best_over(answers, [&](const std::string& a) {
    const std::optional<double> gold = extract_number(a, NumberPick::first);
    if (!gold) return 0.0;
    const double scale = std::max({1.0, std::fabs(*pred), std::fabs(*gold)});
    return std::fabs(*pred - *gold) <= 1e-9 * scale ? 1.0 : 0.0;
  });
}

double code_f1(std::string_view prediction, const Answers& answers) {
  const std::vector<std::string> pred = split_ws(code_of(prediction));
  return best_over(answers, [&](const std::string& a) { return multiset_f1(pred, split_ws(a)); });
}

// ---- Registry --------------------------------------------------------------------------

const std::vector<std::string>& scorer_names() {
  static const std::vector<std::string> names = {"exact", "contains", "f1_en", "f1_zh",
                                                 "choice", "number", "code", "contains_all",
                                                 "function"};
  return names;
}

const char* scorer_name(Scorer scorer) {
  return scorer_names().at(static_cast<size_t>(scorer)).c_str();
}

Scorer scorer_from_name(const std::string& name) {
  const std::vector<std::string>& names = scorer_names();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<Scorer>(i);
  }
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  throw InputError("unknown scorer '" + name + "' (known: " + known + ")");
}

double score(Scorer scorer, std::string_view prediction, const Answers& answers) {
  switch (scorer) {
    case Scorer::exact: return exact_match(prediction, answers);
    case Scorer::contains: return contains(prediction, answers);
    case Scorer::f1_en: return token_f1(prediction, answers);
    case Scorer::f1_zh: return char_f1(prediction, answers);
    case Scorer::choice: return multiple_choice(prediction, answers);
    case Scorer::number: return numeric_match(prediction, answers);
    case Scorer::code: return code_f1(prediction, answers);
    case Scorer::contains_all: return contains_all(prediction, answers);
    case Scorer::function: return function_match(prediction, answers);
  }
  return 0.0;
}

// ---- Mixed retrieval ---------------------------------------------------------------------

double score_mixed_turn(const MixedTurn& turn) {
  return turn.part == MixPart::kv ? contains(turn.prediction, turn.answers)
                                  : code_f1(turn.prediction, turn.answers);
}

MixedScore score_mixed_retrieval(const std::vector<MixedTurn>& turns) {
  MixedScore out;
  double kv_sum = 0, code_sum = 0;
  for (const MixedTurn& t : turns) {
    const double s = score_mixed_turn(t);
    if (t.part == MixPart::kv) {
      kv_sum += s;
      ++out.n_kv;
    } else {
      code_sum += s;
      ++out.n_code;
    }
  }
  if (out.n_kv > 0) out.kv = kv_sum / out.n_kv;
  if (out.n_code > 0) out.code = code_sum / out.n_code;
  if (!turns.empty()) out.overall = (kv_sum + code_sum) / turns.size();
  return out;
}

}  // namespace kvbench
