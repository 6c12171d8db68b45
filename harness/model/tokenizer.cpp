#include "harness/model/tokenizer.h"

#include <algorithm>
#include <queue>
#include <string_view>
#include <utility>

#include "harness/model/gguf.h"
#include "harness/model/unicode.h"

namespace kvbench {

namespace {

// The regexes llama.cpp chains for a pre-tokenizer (llm_tokenizer_bpe). Each step splits every
// chunk the previous steps produced; nothing is ever joined across a chunk boundary.
enum SplitStep : uint8_t {
  kDigitEach,     // \p{N}: every number code point alone
  kPunctRuns,     // [\p{P}\$\+<=>\^~\|]+
  kNumberRuns,    // \p{N}+
  kDigitTriples,  // [0-9][0-9][0-9]
  kGpt2,          // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,        // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                  //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,         // llama3's with \p{N} for \p{N}{1,3}: every digit alone. llama.cpp runs
                  // this one through std::regex on category-collapsed text, not a hand-written
                  // splitter; llama3's splitter gives the same pieces (tokenizer_qwen2.json).
};

struct PreTokenizerSpec {
  std::vector<uint8_t> steps;
  bool ignore_merges = false;
  bool add_bos = false;  // llama.cpp's default when the GGUF has no add_bos_token
};

bool find_pre_tokenizer(const std::string& pre, PreTokenizerSpec* spec) {
  auto in = [&](std::initializer_list<const char*> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return pre == n; });
  };
  if (pre.empty() || pre == "default") {
    *spec = {{kPunctRuns, kGpt2, kNumberRuns, kDigitTriples}, false, false};
  } else if (in({"gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jina-es", "jina-de", "jina-v2-es",
                 "jina-v2-de", "jina-v2-code", "trillion", "granite-docling"})) {
    *spec = {{kGpt2}, false, false};
  } else if (in({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                 "minerva-7b"})) {
    *spec = {{kDigitEach, kGpt2}, false, false};
  } else if (in({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
                 "lfm2"})) {
    *spec = {{kLlama3}, true, true};
  } else if (in({"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
                 "solar-open"})) {
    // llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 names, and the pre-types that share its regex.
    *spec = {{kQwen2}, false, false};
  } else if (in({"dbrx", "smaug-bpe"})) {
    *spec = {{kLlama3}, false, false};
  } else {
    return false;
  }
  return true;
}

const char* kSupportedPre =
    "default, gpt2, smollm (and the starcoder family), llama3/llama-bpe (and its family), "
    "qwen2 (and its family)";

// Class of a code point at a chunk position; kOutside past the chunk end (llama.cpp's empty
// flags), so that look-ahead never crosses a chunk boundary.
constexpr uint8_t kOther = static_cast<uint8_t>(CodePointClass::Other);
constexpr uint8_t kLetter = static_cast<uint8_t>(CodePointClass::Letter);
constexpr uint8_t kNumber = static_cast<uint8_t>(CodePointClass::Number);
constexpr uint8_t kPunct = static_cast<uint8_t>(CodePointClass::Punctuation);
constexpr uint8_t kSpace = static_cast<uint8_t>(CodePointClass::Whitespace);
constexpr uint8_t kOutside = 0xFF;

struct Chunk {
  size_t begin;
  size_t end;
};

class Splitter {
 public:
  Splitter(const std::vector<uint32_t>& cps, const std::vector<uint8_t>& cls)
      : cps_(cps), cls_(cls) {}

  std::vector<Chunk> run(const std::vector<uint8_t>& steps) const {
    std::vector<Chunk> chunks;
    if (!cps_.empty()) chunks.push_back({0, cps_.size()});
    for (uint8_t step : steps) {
      std::vector<Chunk> next;
      next.reserve(chunks.size() * 2);
      for (const Chunk& c : chunks) split(static_cast<SplitStep>(step), c, next);
      chunks.swap(next);
    }
    return chunks;
  }

 private:
  const std::vector<uint32_t>& cps_;
  const std::vector<uint8_t>& cls_;

  void split(SplitStep step, Chunk c, std::vector<Chunk>& out) const {
    switch (step) {
      case kDigitEach:
        return split_matches(c, out, [&](size_t p) { return cls_[p] == kNumber ? 1 : 0; });
      case kPunctRuns:
        return split_matches(c, out, [&](size_t p) {
          size_t q = p;
          while (q < c.end && is_default_punct(q)) ++q;
          return q - p;
        });
      case kNumberRuns:
        return split_matches(c, out, [&](size_t p) {
          size_t q = p;
          while (q < c.end && cls_[q] == kNumber) ++q;
          return q - p;
        });
      case kDigitTriples:
        return split_matches(c, out, [&](size_t p) {
          for (size_t k = 0; k < 3; ++k) {
            if (p + k >= c.end || cps_[p + k] < '0' || cps_[p + k] > '9') return size_t{0};
          }
          return size_t{3};
        });
      case kGpt2:
        return split_gpt2(c, out);
      case kLlama3:
        return split_llama3(c, out, 3);
      case kQwen2:
        return split_llama3(c, out, 1);
    }
  }

  bool is_default_punct(size_t p) const {
    const uint32_t cp = cps_[p];
    return cls_[p] == kPunct || cp == '$' || cp == '+' || cp == '<' || cp == '=' || cp == '>' ||
           cp == '^' || cp == '~' || cp == '|';
  }

  // A std::regex_iterator over the chunk: each match, and each gap between matches, is a piece.
  // match_len(p) is the length of a match starting at p, 0 if none.
  template <typename MatchLen>
  static void split_matches(Chunk c, std::vector<Chunk>& out, MatchLen match_len) {
    size_t gap = c.begin;
    for (size_t p = c.begin; p < c.end;) {
      const size_t len = match_len(p);
      if (len == 0) {
        ++p;
        continue;
      }
      if (p > gap) out.push_back({gap, p});
      out.push_back({p, p + len});
      p += len;
      gap = p;
    }
    if (c.end > gap) out.push_back({gap, c.end});
  }

  uint8_t cls_at(Chunk c, size_t p) const { return p < c.end ? cls_[p] : kOutside; }
  uint32_t cp_at(Chunk c, size_t p) const { return p < c.end ? cps_[p] : 0xFFFFFFFFu; }

  // 's 't 'm 'd 're 've 'll at p: the match length, 0 if none. ASCII case folding suffices for
  // llama3's (?i:...): no other code point lowercases to these letters.
  size_t contraction(Chunk c, size_t p, bool fold_case) const {
    if (cps_[p] != '\'' || p + 1 >= c.end) return 0;
    auto lower = [&](uint32_t cp) { return fold_case && cp >= 'A' && cp <= 'Z' ? cp + 32 : cp; };
    const uint32_t a = lower(cps_[p + 1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (p + 2 >= c.end) return 0;
    const uint32_t b = lower(cps_[p + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }

  static bool is_symbolish(uint8_t k) { return k == kOther || k == kPunct; }

  void split_gpt2(Chunk c, std::vector<Chunk>& out) const {
    size_t start = c.begin;
    auto emit = [&](size_t end) {
      if (end > start) out.push_back({start, end});
      start = end;
    };
    for (size_t pos = c.begin; pos < c.end;) {
      if (const size_t n = contraction(c, pos, false)) {
        emit(pos += n);
        continue;
      }
      const bool space = cps_[pos] == ' ';
      const uint8_t k = space ? cls_at(c, pos + 1) : cls_[pos];
      if (k == kLetter || k == kNumber || is_symbolish(k)) {  // ' ?' then a run of one kind
        pos += space ? 2 : 1;
        if (k == kLetter || k == kNumber) {
          while (cls_at(c, pos) == k) ++pos;
        } else {
          while (is_symbolish(cls_at(c, pos))) ++pos;
        }
        emit(pos);
        continue;
      }
      size_t n_space = 0;
      while (cls_at(c, pos + n_space) == kSpace) ++n_space;
      if (n_space > 1 && pos + n_space < c.end) {  // \s+(?!\S): leave one for the next word
        emit(pos += n_space - 1);
      } else if (n_space > 0) {
        emit(pos += n_space);
      } else {
        emit(++pos);
      }
    }
  }

  // llama3's rule with numbers split into runs of at most max_digits.
  void split_llama3(Chunk c, std::vector<Chunk>& out, size_t max_digits) const {
    size_t start = c.begin;
    auto emit = [&](size_t end) {
      if (end > start) out.push_back({start, end});
      start = end;
    };
    auto is_cr_lf = [](uint32_t cp) { return cp == '\r' || cp == '\n'; };
    for (size_t pos = c.begin; pos < c.end;) {
      if (const size_t n = contraction(c, pos, true)) {
        emit(pos += n);
        continue;
      }
      const uint32_t cp = cps_[pos];
      const uint8_t k = cls_[pos];
      // [^\r\n\p{L}\p{N}]?\p{L}+
      if (!is_cr_lf(cp) && k != kNumber && (k == kLetter || cls_at(c, pos + 1) == kLetter)) {
        ++pos;
        while (cls_at(c, pos) == kLetter) ++pos;
        emit(pos);
        continue;
      }
      // \p{N}{1,max_digits}
      if (k == kNumber) {
        size_t group = pos;
        while (cls_at(c, pos) == kNumber) {
          if (++pos - group >= max_digits) {
            emit(pos);
            group = pos;
          }
        }
        emit(pos);
        continue;
      }
      // ' ?[^\s\p{L}\p{N}]+[\r\n]*'; a lone space at the chunk end also lands here, as in
      // llama.cpp, with the same result as the whitespace rules.
      const uint8_t k2 = cp == ' ' ? cls_at(c, pos + 1) : k;
      if (k2 != kSpace && k2 != kLetter && k2 != kNumber) {
        pos += cp == ' ' ? 1 : 0;
        while (is_symbolish(cls_at(c, pos))) ++pos;
        while (is_cr_lf(cp_at(c, pos))) ++pos;
        emit(pos);
        continue;
      }
      size_t n_space = 0;
      size_t last_cr_lf_end = 0;
      while (cls_at(c, pos + n_space) == kSpace) {
        if (is_cr_lf(cps_[pos + n_space])) last_cr_lf_end = pos + n_space + 1;
        ++n_space;
      }
      if (last_cr_lf_end > 0) {  // \s*[\r\n]+
        emit(pos = last_cr_lf_end);
      } else if (n_space > 1 && pos + n_space < c.end) {  // \s+(?!\S)
        emit(pos += n_space - 1);
      } else if (n_space > 0) {
        emit(pos += n_space);
      } else {
        emit(++pos);
      }
    }
  }
};

// Code points of a raw-text fragment as llama.cpp sees them: each invalid byte is U+FFFD.
std::vector<uint32_t> fragment_code_points(const std::string& text) {
  std::vector<uint32_t> cps = utf8_to_code_points(text);
  for (uint32_t& cp : cps) {
    if (cp & kInvalidByteFlag) cp = 0xFFFD;
  }
  return cps;
}

std::vector<uint8_t> classes_of(const std::vector<uint32_t>& cps) {
  std::vector<uint8_t> cls(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) cls[i] = static_cast<uint8_t>(code_point_class(cps[i]));
  return cls;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

std::vector<std::string> pre_tokenize(const std::string& pre, const std::string& text) {
  PreTokenizerSpec spec;
  if (!find_pre_tokenizer(pre, &spec)) {
    throw InputError("unsupported pre-tokenizer '" + pre + "'; supported: " + kSupportedPre);
  }
  const std::vector<uint32_t> cps = fragment_code_points(text);
  const std::vector<uint8_t> cls = classes_of(cps);
  std::vector<std::string> pieces;
  for (const Chunk& c : Splitter(cps, cls).run(spec.steps)) {
    std::string piece;
    for (size_t i = c.begin; i < c.end; ++i) append_utf8(cps[i], piece);
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

Tokenizer::Tokenizer(VocabData vocab) : vocab_(std::move(vocab)) {
  PreTokenizerSpec spec;
  if (!find_pre_tokenizer(vocab_.pre, &spec)) {
    throw InputError("unsupported pre-tokenizer '" + vocab_.pre + "' (tokenizer.ggml.pre); " +
                     "supported: " + kSupportedPre);
  }
  pre_steps_ = spec.steps;
  ignore_merges_ = spec.ignore_merges;
  const int32_t n_tokens = vocab_size();
  if (!vocab_.token_types.empty() && vocab_.token_types.size() != vocab_.tokens.size()) {
    throw InputError("tokenizer has " + std::to_string(vocab_.tokens.size()) + " tokens but " +
                     std::to_string(vocab_.token_types.size()) + " token types");
  }
  if (vocab_.bos_id >= n_tokens) vocab_.bos_id = -1;
  if (vocab_.eos_id >= n_tokens) vocab_.eos_id = -1;

  // A later duplicate wins, as in llama.cpp's token_to_id.
  token_to_id_.reserve(vocab_.tokens.size());
  for (int32_t id = 0; id < n_tokens; ++id) token_to_id_[vocab_.tokens[id]] = id;

  std::unordered_map<std::string, int32_t> extra_ids;
  auto symbol_of = [&](const std::string& text) {
    auto it = token_to_id_.find(text);
    if (it != token_to_id_.end()) return it->second;
    auto [extra, added] = extra_ids.emplace(text, n_tokens + int32_t(extra_symbols_.size()));
    if (added) extra_symbols_.push_back(text);
    return extra->second;
  };
  merges_.reserve(vocab_.merges.size());
  for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
    const std::string& merge = vocab_.merges[rank];
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) continue;
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    const int32_t l = symbol_of(left);
    const int32_t r = symbol_of(right);
    // The first rank of a repeated pair wins, as with llama.cpp's bpe_ranks.emplace.
    merges_.emplace(pair_key(l, r), Merge{static_cast<int32_t>(rank), symbol_of(left + right)});
  }
  for (int b = 0; b < 256; ++b) {
    auto it = token_to_id_.find(byte_to_token_char(static_cast<uint8_t>(b)));
    auto extra = extra_ids.find(byte_to_token_char(static_cast<uint8_t>(b)));
    byte_symbol_[b] = it != token_to_id_.end()   ? it->second
                      : extra != extra_ids.end() ? extra->second
                                                 : -1;
  }

  // llama.cpp's cache_special_tokens: split out of the text before pre-tokenizing, longest
  // first so that a token containing another wins.
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n_tokens; ++id) {
    if (vocab_.token_types.empty() || vocab_.tokens[id].empty()) continue;
    const TokenType t = vocab_.token_types[id];
    if (t == TokenType::CONTROL || t == TokenType::USER_DEFINED || t == TokenType::UNKNOWN) {
      ids.push_back(id);
    }
  }
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return vocab_.tokens[a].size() > vocab_.tokens[b].size();
  });
  for (int32_t id : ids) {
    special_ids_.push_back(id);
    special_tokens_.push_back(vocab_.tokens[id]);
  }
}

VocabData Tokenizer::read_vocab(const GgufFile& file) {
  const std::string model = file.get_string("tokenizer.ggml.model", "");
  if (model != "gpt2") {
    throw InputError(file.path() + ": tokenizer.ggml.model is '" + model +
                     "', expected 'gpt2' (byte-level BPE)");
  }
  VocabData vocab;
  vocab.tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (file.has("tokenizer.ggml.token_type")) {
    for (int64_t t : file.get_int_array("tokenizer.ggml.token_type")) {
      vocab.token_types.push_back(static_cast<TokenType>(t));
    }
  }
  vocab.merges = file.get_string_array("tokenizer.ggml.merges");
  vocab.pre = file.get_string("tokenizer.ggml.pre", "default");
  vocab.bos_id = static_cast<int32_t>(file.get_int("tokenizer.ggml.bos_token_id", -1));
  vocab.eos_id = static_cast<int32_t>(file.get_int("tokenizer.ggml.eos_token_id", -1));
  PreTokenizerSpec spec;
  if (!find_pre_tokenizer(vocab.pre, &spec)) {
    throw InputError(file.path() + ": unsupported pre-tokenizer '" + vocab.pre +
                     "' (tokenizer.ggml.pre); supported: " + kSupportedPre);
  }
  vocab.add_bos = file.get_bool("tokenizer.ggml.add_bos_token", spec.add_bos);
  return vocab;
}

Tokenizer Tokenizer::from_gguf(const GgufFile& file) {
  VocabData vocab = read_vocab(file);
  try {
    return Tokenizer(std::move(vocab));
  } catch (const InputError& e) {
    throw InputError(file.path() + ": " + e.what());
  }
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  // BOS is added unless the text already starts with it (a rendered Llama-3 chat does), so a
  // prompt never begins with two.
  if (vocab_.add_bos && vocab_.bos_id >= 0 &&
      (!parse_special || text.rfind(vocab_.tokens[vocab_.bos_id], 0) != 0)) {
    out.push_back(vocab_.bos_id);
  }

  // Fragments of raw text (token < 0) and special tokens, as llama.cpp's tokenizer_st_partition.
  struct Fragment {
    size_t begin;
    size_t end;
    int32_t token;
  };
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({0, text.size(), -1});
  std::vector<Fragment> next;
  for (size_t s = 0; s < special_ids_.size(); ++s) {
    const TokenType type = vocab_.token_types[special_ids_[s]];
    if (!parse_special && type != TokenType::USER_DEFINED) continue;
    const std::string& special = special_tokens_[s];
    if (text.find(special) == std::string::npos) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      while (pos < f.end) {
        const size_t match = std::string_view(text.data(), f.end).find(special, pos);
        if (match == std::string_view::npos) break;
        if (match > pos) next.push_back({pos, match, -1});
        next.push_back({match, match + special.size(), special_ids_[s]});
        pos = match + special.size();
      }
      if (pos < f.end) next.push_back({pos, f.end, -1});
    }
    fragments.swap(next);
  }
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
    } else {
      encode_text(text.substr(f.begin, f.end - f.begin), out);
    }
  }
  return out;
}

void Tokenizer::encode_text(const std::string& text, std::vector<int32_t>& out) const {
  const std::vector<uint32_t> cps = fragment_code_points(text);
  const std::vector<uint8_t> cls = classes_of(cps);
  std::string word;
  for (const Chunk& c : Splitter(cps, cls).run(pre_steps_)) {
    word.clear();
    for (size_t i = c.begin; i < c.end; ++i) append_utf8(cps[i], word);
    bpe_word(word, out);
  }
}

void Tokenizer::emit_symbol(int32_t symbol, uint8_t byte, std::vector<int32_t>& out) const {
  if (symbol >= 0 && symbol < vocab_size()) {
    out.push_back(symbol);
    return;
  }
  // Not a token (a vocab without some merge result or byte char): like llama.cpp, each byte of
  // the symbol's text that is itself a token is kept, the rest dropped.
  const std::string& text =
      symbol < 0 ? byte_to_token_char(byte) : extra_symbols_[symbol - vocab_size()];
  for (char ch : text) {
    auto it = token_to_id_.find(std::string(1, ch));
    if (it != token_to_id_.end()) out.push_back(it->second);
  }
}

void Tokenizer::bpe_word(const std::string& word, std::vector<int32_t>& out) const {
  const size_t n = word.size();
  if (n == 0) return;
  if (ignore_merges_) {
    std::string encoded;
    for (unsigned char b : word) encoded += byte_to_token_char(b);
    auto it = token_to_id_.find(encoded);
    if (it != token_to_id_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(word.data());
  if (n == 1) {
    emit_symbol(byte_symbol_[bytes[0]], bytes[0], out);
    return;
  }

  // One symbol per byte (one alphabet char each), merged by rank; ties go to the leftmost pair.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> sym(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = {byte_symbol_[bytes[i]], static_cast<int32_t>(i) - 1,
              i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  struct Bigram {
    int32_t rank;
    int32_t left;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
    bool operator<(const Bigram& o) const {  // std::priority_queue pops the largest
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Bigram> queue;
  auto try_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[left].next;
    if (right < 0 || sym[left].id < 0 || sym[right].id < 0) return;
    auto it = merges_.find(pair_key(sym[left].id, sym[right].id));
    if (it != merges_.end())
      queue.push({it->second.rank, left, sym[left].id, sym[right].id, it->second.result});
  };
  for (size_t i = 0; i + 1 < n; ++i) try_pair(static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = sym[b.left];
    // Stale if either side has merged since: ids only ever change by growing.
    if (left.id != b.left_id || left.next < 0 || sym[left.next].id != b.right_id) continue;
    const int32_t right = left.next;
    left.id = b.result;
    left.next = sym[right].next;
    if (left.next >= 0) sym[left.next].prev = b.left;
    sym[right].id = -2;  // merged away
    try_pair(left.prev);
    try_pair(b.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) emit_symbol(sym[i].id, bytes[i], out);
}

std::string Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  const std::string& text = vocab_.tokens[id];
  const TokenType type = vocab_.token_types.empty() ? TokenType::NORMAL : vocab_.token_types[id];
  switch (type) {
    case TokenType::CONTROL:
    case TokenType::USER_DEFINED:
    case TokenType::UNKNOWN:
      return text;
    case TokenType::NORMAL:
    case TokenType::BYTE: {
      std::string bytes;
      for (uint32_t cp : utf8_to_code_points(text)) {
        const int b = (cp & kInvalidByteFlag) ? -1 : token_char_to_byte(cp);
        if (b >= 0) {
          bytes += static_cast<char>(b);
        } else {
          append_utf8(cp, bytes);  // outside the byte alphabet: kept as written
        }
      }
      return bytes;
    }
    default:  // UNUSED, UNDEFINED: llama.cpp prints nothing
      return "";
  }
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_text(id);
  return out;
}

int32_t Tokenizer::find_token(const std::string& text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

bool Tokenizer::is_control(int32_t id) const {
  return id >= 0 && id < vocab_size() && !vocab_.token_types.empty() &&
         vocab_.token_types[id] == TokenType::CONTROL;
}

}  // namespace kvbench
