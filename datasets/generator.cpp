// Seeded generators of SCBench's synthetic tasks. Each task is a builder: given an item
// count (key-value pairs, strings, noise sentences, numbers) and an optional padding item,
// it lays out the context and the turns. The sizer searches the item count (exponential,
// then binary search) with the real tokenizer until the context is within 2% of the target;
// where one item is coarser than 2% (a UUID pair is ~50 tokens), one shorter padding item
// fills the rest. All randomness comes from splitmix64 seeded by (seed, sample index), so
// the output is byte-identical across platforms and standard libraries.
#include "datasets/generator.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/input_error.h"
#include "datasets/generator_parts.h"
#include "harness/model/tokenizer.h"

namespace kvbench {

namespace {

using namespace generator_parts;


constexpr char kHex[] = "0123456789abcdef";
constexpr char kLowerDigits[] = "abcdefghijklmnopqrstuvwxyz0123456789";
constexpr char kUpper[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";

// ---------------------------------------------------------------------------------------
// Registry and knobs.

const std::vector<TaskInfo>& registry() {
  static const std::vector<TaskInfo> tasks = {
      {"retr_kv",
       "Retr.KV: a JSON object of random UUID key-value pairs; each turn asks the value of a "
       "different key",
       {{"key_length", "36",
         "characters of each key and value: 36 is a UUID (8-4-4-4-12 hex, as SCBench), "
         "4..32 plain hex (easier)"}}},
      {"retr_prefix_suffix",
       "Retr.Prefix-Suffix: a list of random strings; each turn asks for the string with a "
       "given prefix and suffix",
       {{"string_length", "12", "characters of each string (6..64)"},
        {"affix_length", "4", "characters of the asked prefix and of the suffix (1..(length-2)/2: the middle is "
         "only in the context)"},
        {"distractors", "0",
         "per asked string, this many strings share its prefix and as many its suffix (0..16)"}}},
      {"multihop_vt",
       "Retr.MultiHop: RULER variable tracking, chains of VAR X = VAR Y assignments in noise "
       "text; each turn asks which variables hold a value",
       {{"hops", "1", "assignments VAR X = VAR Y after the first VAR X = value, per chain (1..20)"},
        {"chains", "0", "chains in the context, each asked at most once; 0 means one per turn"},
        {"value_digits", "5", "digits of each chain's value (1..9)"}}},
      {"math_find",
       "Math.Find: a long list of numbers; turns ask the largest, smallest, second largest, "
       "second smallest and median (at most 5 turns)",
       {{"digits", "3", "digits of each number (2..9)"},
        {"questions", "5",
         "ask only the first N of largest, smallest, second largest, second smallest, median "
         "(1..5); turn t asks question t mod N"},
        {"lists", "1",
         "named lists sharing the numbers (1..26); above 1, turn t asks about list t, so "
         "lists must be at least the turns"}}},
      {"docs_kv",
       "Documents (CacheBlend's RAG case): short project notes, each with one or two facts "
       "(an access code, a room number), in a shuffled order; each turn asks one fact",
       {{"documents", "8",
         "documents in the context (2..64), the same ones in every sample of a seed, each "
         "sample in its own order; every other one holds a second fact"}}},
      {"niah",
       "RULER's multi-key needle in a haystack over real prose (corpus gnu-standards): "
       "special magic numbers for adjective-noun keys at seeded depths; each turn asks one key",
       {{"needles", "0",
         "needles in the context, each key asked at most once; 0 means one per turn"},
        {"depth_from", "0", "the shallowest needle depth, % of the haystack (0..100)"},
        {"depth_to", "100", "the deepest needle depth, % of the haystack (0..100)"},
        {"value_digits", "7", "digits of each number (3..12)"},
        {"distractors", "0",
         "per asked key, this many needles with the same key, another number and another kind "
         "(special magic codes, dates, counts) (0..3)"}}},
      {"repoqa",
       "Code.RepoQA over real Python (corpus more-itertools): each turn quotes a function's "
       "docstring, removed from the context, and asks the function's name",
       {{"functions", "0",
         "functions whose docstrings are removed, each asked at most once; 0 means one per "
         "turn"},
        {"rename", "1",
         "1: every top-level function name becomes a seeded neutral name (func_qzkt) at its "
         "def and every use, so the answer needs the context; 0: the library's own names"}}},
      {"repoqa_function",
       "Code.RepoQA as SCBench asks it, over the same code as repoqa: each turn describes a "
       "function by its docstring (removed from the context) and asks for the whole function "
       "in a code block; it passes at RepoQA's similarity 0.8 (scorer function)",
       {{"functions", "0",
         "functions whose docstrings are removed, each asked at most once; 0 means one per "
         "turn"},
        {"rename", "1",
         "1: every top-level function name becomes a seeded neutral name at its def and every "
         "use; 0: the library's own names"}}},
      {"mix",
       "Two tasks over one context (their contexts concatenated); turns alternate, the first "
       "task first. The parts' knobs pass through",
       {{"tasks", "retr_kv+retr_prefix_suffix", "the two tasks, A+B (any two different ones above)"}}},
  };
  return tasks;
}

const TaskInfo* find_task(const std::string& name) {
  for (const auto& t : registry()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string task_names() {
  std::string s;
  for (const auto& t : registry()) s += (s.empty() ? "" : ", ") + t.name;
  return s;
}


bool within(int64_t tokens, int64_t target) {
  return std::abs(static_cast<double>(tokens - target)) <=
         kContextTolerance * static_cast<double>(target);
}

Built size_to(const Plan& plan, const Tokenizer& tok, int64_t target, int32_t turns) {
  struct Cand {
    Built built;
    int64_t tokens;
  };
  auto make = [&](int64_t items, int64_t pad) {
    Built b = plan.build(items, pad);
    const int64_t t = count_context_tokens(tok, b.context);
    return Cand{std::move(b), t};
  };
  Cand lo = make(plan.min_items, 0);
  if (lo.tokens > target) {
    if (within(lo.tokens, target)) return std::move(lo.built);
    fail(plan.task, "context_tokens " + std::to_string(target) + " is too small for " +
                        std::to_string(turns) + " turns with these knobs (the smallest context is " +
                        std::to_string(lo.tokens) + " tokens)");
  }
  // Exponential search for an item count over the target, then bisect: lo fits, hi does not.
  int64_t lo_n = plan.min_items;
  int64_t hi_n = std::max<int64_t>(plan.min_items * 2, plan.min_items + 1);
  Cand hi = make(hi_n, 0);
  while (hi.tokens <= target) {
    if (plan.max_items > 0 && hi_n >= plan.max_items) {  // the whole corpus is not enough
      if (within(hi.tokens, target)) return std::move(hi.built);
      fail(plan.task, "context_tokens " + std::to_string(target) + " is more than the corpus " +
                          "holds (" + std::to_string(hi.tokens) + " tokens)");
    }
    lo_n = hi_n;
    lo = std::move(hi);
    if (hi_n > (int64_t{1} << 40)) throw std::logic_error("generator: context does not grow");
    hi_n = plan.max_items > 0 ? std::min(hi_n * 2, plan.max_items) : hi_n * 2;
    hi = make(hi_n, 0);
  }
  while (hi_n - lo_n > 1) {
    const int64_t mid = lo_n + (hi_n - lo_n) / 2;
    Cand c = make(mid, 0);
    if (c.tokens <= target) {
      lo_n = mid;
      lo = std::move(c);
    } else {
      hi_n = mid;
      hi = std::move(c);
    }
  }
  Cand* best = (target - lo.tokens) <= (hi.tokens - target) ? &lo : &hi;
  if (within(best->tokens, target) || plan.pad_max == 0) {
    if (!within(best->tokens, target)) {
      fail(plan.task, "cannot size the context to " + std::to_string(target) +
                          " tokens within 2% (got " + std::to_string(best->tokens) + ")");
    }
    return std::move(best->built);
  }
  // Between lo_n and lo_n + 1 items: a padding item of 1..pad_max, bisected.
  int64_t plo = 0, phi = plan.pad_max + 1;  // pad plo fits (0 = lo), phi does not (or none)
  Cand pfit = std::move(lo);
  Cand pover = std::move(hi);
  while (phi - plo > 1) {
    const int64_t mid = plo + (phi - plo) / 2;
    Cand c = make(lo_n, mid);
    if (c.tokens <= target) {
      plo = mid;
      pfit = std::move(c);
    } else {
      phi = mid;
      pover = std::move(c);
    }
  }
  best = (target - pfit.tokens) <= (pover.tokens - target) ? &pfit : &pover;
  if (!within(best->tokens, target)) {
    fail(plan.task, "cannot size the context to " + std::to_string(target) +
                        " tokens within 2% (got " + std::to_string(best->tokens) + ")");
  }
  return std::move(best->built);
}

// ---------------------------------------------------------------------------------------
// retr_kv. Context as SCBench's scbench_kv (InfiniteBench kv_retrieval): the instruction of
// SCBench's template (eval_utils.py, multiturn_templates["scbench_kv"]), then a JSON object
// as Python's json.dumps writes it ({"k": "v", "k": "v"}). Turn as InfiniteBench's
// kv_retrieval input: Key: "<key>"\nThe value associated with the specified key is: 

std::string make_id(Rng& rng, int64_t len) {
  if (len == 36) {
    const std::string h = random_string(rng, kHex, 16, 32);
    return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) +
           "-" + h.substr(20, 12);
  }
  return random_string(rng, kHex, 16, len);
}

Plan plan_retr_kv(const Knobs& knobs, int32_t turns, uint64_t seed) {
  const int64_t key_length = knobs.integer("key_length", 4, 36);
  if (key_length > 32 && key_length < 36) {
    fail("retr_kv", "knob key_length must be 36 (a UUID) or 4..32 hex characters, not " +
                        std::to_string(key_length));
  }
  Plan plan;
  plan.task = "retr_kv";
  plan.min_items = turns;
  plan.pad_max = std::min<int64_t>(key_length, 32) - 1;
  plan.build = [=](int64_t n, int64_t pad) {
    Rng rng(seed);
    std::set<std::string> keys;
    std::vector<std::pair<std::string, std::string>> pairs;
    auto add_pair = [&](int64_t len) {
      std::string k;
      do {
        k = make_id(rng, len);
      } while (!keys.insert(k).second);
      pairs.emplace_back(k, make_id(rng, len));
    };
    for (int64_t i = 0; i < n; ++i) add_pair(key_length);
    // Padding pair (never asked): shorter plain-hex key and value.
    if (pad > 0) add_pair(pad);
    Built b;
    b.context = "Extract the value corresponding to the specified key in the JSON object below.\n\n{";
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (i) b.context += ", ";
      b.context += "\"" + pairs[i].first + "\": \"" + pairs[i].second + "\"";
    }
    b.context += "}";
    for (int64_t i : choose_distinct(rng, n, turns)) {
      const auto& p = pairs[static_cast<size_t>(i)];
      b.turns.push_back(make_turn(
          "Key: \"" + p.first + "\"\nThe value associated with the specified key is: ", {p.second}));
    }
    return b;
  };
  return plan;
}

// ---------------------------------------------------------------------------------------
// retr_prefix_suffix. SCBench's data file (scbench_prefix_suffix.jsonl) is not reachable and
// its code holds only the bare template "{context}\n\n{input}", so the phrasing is kvbench's:
// an instruction line, then one string per line; the turn asks
// Which string in the list has the prefix "P" and the suffix "S"? Answer with the string only.

Plan plan_prefix_suffix(const Knobs& knobs, int32_t turns, uint64_t seed) {
  const int64_t len = knobs.integer("string_length", 6, 64);
  // At least two characters between prefix and suffix: otherwise the answer is the prefix
  // and suffix written together, and the context is not needed.
  const int64_t affix = knobs.integer("affix_length", 1, (len - 2) / 2);
  const int64_t distractors = knobs.integer("distractors", 0, 16);
  Plan plan;
  plan.task = "retr_prefix_suffix";
  plan.min_items = static_cast<int64_t>(turns) * (1 + 2 * distractors);
  plan.pad_max = len - 1;
  plan.build = [=](int64_t n, int64_t pad) {
    Rng rng(seed);
    auto rnd = [&](int64_t l) { return random_string(rng, kLowerDigits, 36, l); };
    auto has = [&](const std::string& s, const std::string& p, const std::string& q) {
      return s.size() >= p.size() + q.size() && s.compare(0, p.size(), p) == 0 &&
             s.compare(s.size() - q.size(), q.size(), q) == 0;
    };
    // Targets first, with distinct (prefix, suffix) pairs.
    std::vector<std::string> targets, pre, suf;
    while (static_cast<int32_t>(targets.size()) < turns) {
      std::string t = rnd(len);
      bool clash = false;
      for (size_t j = 0; j < targets.size(); ++j) clash = clash || has(t, pre[j], suf[j]);
      if (clash) continue;
      targets.push_back(t);
      pre.push_back(t.substr(0, static_cast<size_t>(affix)));
      suf.push_back(t.substr(static_cast<size_t>(len - affix)));
    }
    auto matches_any = [&](const std::string& s) {
      for (size_t j = 0; j < targets.size(); ++j) {
        if (has(s, pre[j], suf[j])) return true;
      }
      return false;
    };
    // Slots: a seeded shuffle puts the targets and distractors at random positions.
    const std::vector<int64_t> slots = choose_distinct(rng, n, plan.min_items);
    std::vector<std::string> items(static_cast<size_t>(n));
    std::vector<bool> placed(static_cast<size_t>(n), false);
    size_t s = 0;
    for (int32_t j = 0; j < turns; ++j) {
      items[static_cast<size_t>(slots[s])] = targets[static_cast<size_t>(j)];
      placed[static_cast<size_t>(slots[s++])] = true;
      for (int64_t d = 0; d < 2 * distractors; ++d) {
        std::string x;
        do {  // shares the prefix (even d) or the suffix (odd d), never both
          x = d % 2 == 0 ? pre[static_cast<size_t>(j)] + rnd(len - affix)
                         : rnd(len - affix) + suf[static_cast<size_t>(j)];
        } while (matches_any(x));
        items[static_cast<size_t>(slots[s])] = x;
        placed[static_cast<size_t>(slots[s++])] = true;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      if (placed[static_cast<size_t>(i)]) continue;
      std::string x;
      do {
        x = rnd(len);
      } while (matches_any(x));
      items[static_cast<size_t>(i)] = x;
    }
    if (pad > 0) {  // padding string (never asked): shorter
      std::string x;
      do {
        x = rnd(pad);
      } while (matches_any(x));
      items.push_back(x);
    }
    Built b;
    b.context = "Find the string with the given prefix and suffix in the list of strings below.\n\n";
    for (size_t i = 0; i < items.size(); ++i) b.context += (i ? "\n" : "") + items[i];
    for (int32_t j = 0; j < turns; ++j) {
      b.turns.push_back(make_turn("Which string in the list has the prefix \"" + pre[static_cast<size_t>(j)] +
                                      "\" and the suffix \"" + suf[static_cast<size_t>(j)] +
                                      "\"? Answer with the string only.",
                                  {targets[static_cast<size_t>(j)]}));
    }
    return b;
  };
  return plan;
}

// ---------------------------------------------------------------------------------------
// multihop_vt, as RULER's variable tracking (RULER scripts/data/synthetic/variable_tracking.py):
// the instruction "Memorize and track the chain(s) of variable assignment hidden in the
// following text.", noise sentences "The grass is green. The sky is blue. The sun is yellow.
// Here we go. There and back again." with the statements "VAR ABCDE = 12345." and
// "VAR FGHIJ = VAR ABCDE." inserted in chain order at random places. The turn is RULER's
// question with its answer prefix (RULER spells "assgined"; kvbench spells it right).

Plan plan_vt(const Knobs& knobs, int32_t turns, uint64_t seed) {
  const int64_t hops = knobs.integer("hops", 1, 20);
  int64_t chains = knobs.integer("chains", 0, 100);
  const int64_t digits = knobs.integer("value_digits", 1, 9);
  if (chains == 0) chains = turns;
  if (chains < turns) {
    fail("multihop_vt", "knob chains " + std::to_string(chains) + " is fewer than the " +
                            std::to_string(turns) + " turns (each turn asks a different chain)");
  }
  int64_t value_space = 9;
  for (int64_t i = 1; i < digits; ++i) value_space *= 10;
  if (value_space < chains) {
    fail("multihop_vt", "knob value_digits " + std::to_string(digits) + " has fewer values than " +
                            std::to_string(chains) + " chains");
  }
  Plan plan;
  plan.task = "multihop_vt";
  plan.min_items = 0;
  plan.build = [=](int64_t n, int64_t) {
    static const char* const kNoise[] = {"The grass is green.", "The sky is blue.",
                                         "The sun is yellow.", "Here we go.",
                                         "There and back again."};
    Rng rng(seed);
    std::set<std::string> used_names, used_values;
    std::vector<std::vector<std::string>> names(static_cast<size_t>(chains));
    std::vector<std::string> values;
    for (auto& chain : names) {
      for (int64_t k = 0; k <= hops; ++k) {
        std::string x;
        do {
          x = random_string(rng, kUpper, 26, 5);
        } while (!used_names.insert(x).second);
        chain.push_back(x);
      }
      std::string v;
      do {
        v = std::to_string(rng.between(value_space / 9, value_space / 9 * 10 - 1));
      } while (!used_values.insert(v).second);
      values.push_back(v);
    }
    // Statement (chain c, step k) goes before noise sentence pos; positions sorted per chain.
    struct Stmt {
      int64_t pos, chain, k;
    };
    std::vector<Stmt> stmts;
    for (int64_t c = 0; c < chains; ++c) {
      std::vector<int64_t> pos;
      for (int64_t k = 0; k <= hops; ++k) pos.push_back(rng.between(0, n));
      std::sort(pos.begin(), pos.end());
      for (int64_t k = 0; k <= hops; ++k) stmts.push_back({pos[static_cast<size_t>(k)], c, k});
    }
    std::sort(stmts.begin(), stmts.end(), [](const Stmt& a, const Stmt& b) {
      if (a.pos != b.pos) return a.pos < b.pos;
      if (a.chain != b.chain) return a.chain < b.chain;
      return a.k < b.k;
    });
    Built b;
    b.context = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
    std::string body;
    size_t si = 0;
    for (int64_t g = 0; g <= n; ++g) {
      for (; si < stmts.size() && stmts[si].pos == g; ++si) {
        const auto& st = stmts[si];
        const auto& chain = names[static_cast<size_t>(st.chain)];
        const std::string rhs = st.k == 0 ? values[static_cast<size_t>(st.chain)]
                                          : "VAR " + chain[static_cast<size_t>(st.k - 1)];
        body += (body.empty() ? "" : " ") + ("VAR " + chain[static_cast<size_t>(st.k)] + " = " + rhs + ".");
      }
      if (g < n) body += (body.empty() ? "" : " ") + std::string(kNoise[g % 5]);
    }
    b.context += body;
    for (int64_t c : choose_distinct(rng, chains, turns)) {
      const std::string& v = values[static_cast<size_t>(c)];
      SampleTurn turn = make_turn(
          "Question: Find all variables that are assigned the value " + v +
              " in the text above. Answer: According to the chain(s) of variable assignment in "
              "the text above, " +
              std::to_string(hops + 1) + " variables are assigned the value " + v + ", they are: ",
          names[static_cast<size_t>(c)]);
      // Every name is required (contains_all); the gold answer the session feeds lists them.
      turn.reference = join(turn.answers, ", ");
      b.turns.push_back(std::move(turn));
    }
    return b;
  };
  return plan;
}

// ---------------------------------------------------------------------------------------
// math_find, as SCBench's scbench_mf (InfiniteBench math_find): a list of integers written
// [a, b, c]; each turn is SCBench's query "What is <target>?" (run_scbench.py builds it from
// the input's "The ... is") followed by InfiniteBench's input "You should answer with only
// one number, no other words. The <target> is: ". The extremes are planted unique (the
// largest and second largest in the top tenth of the range, the smallest two in the bottom
// tenth, everything else strictly between), so each answer is unambiguous; every list's
// count is odd so the median is one element.
//
// Knobs beyond SCBench's, for models that cannot rank a whole list: `questions` keeps the
// first N of the five questions, and `lists` splits the numbers into named lists (List A,
// List B, ...), each turn asking about its own list, so five turns need not ask the second
// largest or the median. The sized item is one pair of numbers, dealt round the lists.

Plan plan_math(const Knobs& knobs, int32_t turns, uint64_t seed) {
  const int64_t digits = knobs.integer("digits", 2, 9);
  const int64_t questions = knobs.integer("questions", 1, 5);
  const int64_t lists = knobs.integer("lists", 1, 26);
  if (lists == 1 && turns > questions) {
    fail("math_find", "turns " + std::to_string(turns) + " is more than the " +
                          std::to_string(questions) +
                          " questions of one list (largest, smallest, second largest, second "
                          "smallest, median); knob lists gives each turn a list of its own");
  }
  if (lists > 1 && turns > lists) {
    fail("math_find", "turns " + std::to_string(turns) + " is more than knob lists " +
                          std::to_string(lists) + " (each turn asks about its own list)");
  }
  int64_t lo = 1;
  for (int64_t i = 1; i < digits; ++i) lo *= 10;
  const int64_t hi = lo * 10 - 1;
  const int64_t band = std::max<int64_t>(3, (hi - lo + 1) / 10);
  Plan plan;
  plan.task = "math_find";
  plan.min_items = 2 * lists;  // pairs of numbers: list i has 2 * (its pairs) + 1
  plan.build = [=](int64_t pairs, int64_t) {
    Rng rng(seed);
    const char* const kQuestions[] = {"the largest number", "the smallest number",
                                      "the second largest number",
                                      "the second smallest number", "the median"};
    Built b;
    b.context = lists == 1 ? "Answer the questions about the list of numbers below.\n\n"
                           : "Answer the questions about the lists of numbers below.\n\n";
    std::vector<std::array<int64_t, 5>> answers;  // per list: largest, smallest, ..., median
    for (int64_t l = 0; l < lists; ++l) {
      const int64_t count = 2 * (pairs / lists + (l < pairs % lists ? 1 : 0)) + 1;
      const int64_t m1 = rng.between(lo, lo + band - 2);
      const int64_t m2 = rng.between(m1 + 1, lo + band - 1);
      const int64_t x1 = rng.between(hi - band + 2, hi);
      const int64_t x2 = rng.between(hi - band + 1, x1 - 1);
      std::vector<int64_t> nums = {x1, m1, x2, m2};
      while (static_cast<int64_t>(nums.size()) < count) nums.push_back(rng.between(m2 + 1, x2 - 1));
      for (int64_t i = count - 1; i > 0; --i) {
        std::swap(nums[static_cast<size_t>(i)], nums[static_cast<size_t>(rng.between(0, i))]);
      }
      std::vector<int64_t> sorted = nums;
      std::sort(sorted.begin(), sorted.end());
      answers.push_back({x1, m1, x2, m2, sorted[static_cast<size_t>(count / 2)]});
      if (lists > 1) b.context += std::string(l ? "\n\n" : "") + "List " + char('A' + l) + ": ";
      b.context += "[";
      for (size_t i = 0; i < nums.size(); ++i) b.context += (i ? ", " : "") + std::to_string(nums[i]);
      b.context += "]";
    }
    for (int32_t t = 0; t < turns; ++t) {
      const size_t question = static_cast<size_t>(t % questions);
      const size_t list = lists == 1 ? 0 : static_cast<size_t>(t);
      std::string target = std::string(kQuestions[question]) +
                           (lists == 1 ? " of the list" : std::string(" of List ") + char('A' + list));
      std::string cap = target;
      cap[0] = 'T';
      b.turns.push_back(make_turn("What is " + target +
                                      "?\n\nYou should answer with only one number, no other words. " +
                                      cap + " is: ",
                                  {std::to_string(answers[list][question])}));
    }
    return b;
  };
  return plan;
}

// ---------------------------------------------------------------------------------------
// docs_kv: a retrieval-augmented context, documents a server could have cached one by one
// (CacheBlend). Each document is notes on one project: a title line, then filler sentences
// with one or two facts ("The access code of Project Falcon is 482913.") at random places.
// The documents come from the run's seed alone, so every sample holds the same ones (as a
// RAG store would serve them); each sample orders them and picks its questions by its own
// seed. The filler count is the sized item; a truncated extra sentence pads.

constexpr const char* kProjectNames[] = {
    "Falcon",  "Juniper", "Harbor",  "Quartz",  "Meadow",  "Lantern", "Cobalt",  "Willow",
    "Summit",  "Ember",   "Atlas",   "Beacon",  "Cedar",   "Delta",   "Echo",    "Fjord",
    "Granite", "Horizon", "Iris",    "Jasper",  "Kestrel", "Lotus",   "Maple",   "Nimbus",
    "Onyx",    "Pioneer", "Quill",   "Raven",   "Sierra",  "Tundra",  "Umber",   "Vesper",
    "Walnut",  "Yonder",  "Zephyr",  "Aurora",  "Bramble", "Canyon",  "Dune",    "Elm",
    "Flint",   "Glacier", "Hollow",  "Indigo",  "Jade",    "Kelp",    "Linden",  "Mosaic",
    "Nectar",  "Orchid",  "Pebble",  "Quarry",  "Ridge",   "Saffron", "Thistle", "Upland",
    "Valley",  "Wren",    "Yarrow",  "Zinnia",  "Alder",   "Birch",   "Comet",   "Drift"};
constexpr int64_t kProjectCount = sizeof(kProjectNames) / sizeof(kProjectNames[0]);

// A document's first fact gives its first attribute, a second fact its second.
constexpr const char* kFactAttributes[] = {"access code", "room number"};

constexpr const char* kProjectFiller[] = {
    "The team met on Monday to review the schedule.",
    "Several suppliers were asked to send new offers.",
    "The budget was discussed at length but not changed.",
    "A short report on the tests was shared with everyone.",
    "Two new members joined the group this month.",
    "The office moved to the second floor of the east wing.",
    "Most of the open questions concern the delivery dates.",
    "The weather delayed the site visit by a few days.",
    "Everyone agreed that the documentation needs more work.",
    "The manager thanked the staff for their patience.",
    "A workshop on safety rules is planned for next week.",
    "The old printers will be replaced before the summer.",
    "Feedback from the first users was mostly positive.",
    "The review board asked for a clearer time line.",
    "Coffee and lunch were served in the main hall.",
    "Nobody raised any concern about the new tools."};
constexpr int64_t kProjectFillerCount = sizeof(kProjectFiller) / sizeof(kProjectFiller[0]);

// The padding sentence: its first `pad` words and a full stop.
constexpr const char* kProjectPadding[] = {
    "Further", "details", "on", "this", "matter", "were", "left", "for", "a", "later",
    "meeting", "of", "the", "whole", "committee", "and", "its", "many", "advisers", "abroad"};
constexpr int64_t kProjectPaddingWords = sizeof(kProjectPadding) / sizeof(kProjectPadding[0]);

Plan plan_docs_kv(const Knobs& knobs, int32_t turns, uint64_t documents_seed,
                  uint64_t sample_seed) {
  const int64_t documents = knobs.integer("documents", 2, kProjectCount);
  const int64_t facts = documents + documents / 2;  // documents 1, 3, 5, ... hold two
  if (facts < turns) {
    fail("docs_kv", "knob documents " + std::to_string(documents) + " holds " +
                        std::to_string(facts) + " facts, fewer than the " +
                        std::to_string(turns) + " turns (each turn asks a different fact)");
  }
  Plan plan;
  plan.task = "docs_kv";
  plan.min_items = 0;
  plan.pad_max = kProjectPaddingWords;
  plan.build = [=](int64_t n, int64_t pad) {
    struct Fact {
      std::string question, answer;
    };
    Rng rng(documents_seed);
    const std::vector<int64_t> names = choose_distinct(rng, kProjectCount, documents);
    std::set<std::string> used_values;
    std::vector<std::string> docs;
    std::vector<Fact> all_facts;
    for (int64_t d = 0; d < documents; ++d) {
      const std::string project = std::string("Project ") + kProjectNames[names[d]];
      std::vector<std::string> sentences;
      const int64_t filler = n / documents + (d < n % documents ? 1 : 0);
      for (int64_t i = 0; i < filler; ++i) {
        sentences.push_back(kProjectFiller[rng.below(kProjectFillerCount)]);
      }
      for (int64_t f = 0; f < 1 + d % 2; ++f) {
        std::string value;
        do {
          value = std::to_string(rng.between(100000, 999999));
        } while (!used_values.insert(value).second);
        const std::string attribute = kFactAttributes[f];
        const int64_t at = rng.between(0, static_cast<int64_t>(sentences.size()));
        sentences.insert(sentences.begin() + at,
                         "The " + attribute + " of " + project + " is " + value + ".");
        all_facts.push_back({"What is the " + attribute + " of " + project +
                                 "? Answer with the number only.",
                             value});
      }
      if (pad > 0 && d == documents - 1) {
        std::vector<std::string> words(kProjectPadding, kProjectPadding + pad);
        sentences.push_back(join(words, " ") + ".");
      }
      docs.push_back("Notes on " + project + ".\n" + join(sentences, " "));
    }
    Rng order_rng(sample_seed);
    Built b;
    for (int64_t i : choose_distinct(order_rng, documents, documents)) {
      b.documents.push_back(docs[static_cast<size_t>(i)]);
    }
    b.context = join(b.documents, "\n\n");
    for (int64_t i : choose_distinct(order_rng, facts, turns)) {
      const Fact& fact = all_facts[static_cast<size_t>(i)];
      b.turns.push_back(make_turn(fact.question, {fact.answer}));
    }
    return b;
  };
  return plan;
}

// docs_kv's documents come from the run's seed (shared by its samples), every other task
// from the sample's.
Plan plan_for(const std::string& task, const Knobs& knobs, int32_t turns, uint64_t seed,
              uint64_t run_seed, const GeneratorOptions& options) {
  if (task == "niah") {
    return plan_niah(knobs, turns, seed, options.prose ? *options.prose : pinned_prose_corpus());
  }
  if (task == "repoqa" || task == "repoqa_function") {
    return plan_repoqa(knobs, turns, seed, options.code ? *options.code : pinned_code_corpus(),
                       task == "repoqa" ? RepoqaAnswer::name : RepoqaAnswer::function);
  }
  if (task == "docs_kv") return plan_docs_kv(knobs, turns, run_seed, seed);
  if (task == "retr_kv") return plan_retr_kv(knobs, turns, seed);
  if (task == "retr_prefix_suffix") return plan_prefix_suffix(knobs, turns, seed);
  if (task == "multihop_vt") return plan_vt(knobs, turns, seed);
  if (task == "math_find") return plan_math(knobs, turns, seed);
  throw std::logic_error("generator: no plan for " + task);
}

void check_knob_names(const TaskInfo& info, const std::map<std::string, std::string>& knobs,
                      const std::vector<const TaskInfo*>& also) {
  for (const auto& knob : knobs) {
    const std::string& name = knob.first;  // not a structured binding: lambdas capture it
    bool known = false;
    std::string names;
    auto scan = [&](const TaskInfo& t) {
      for (const auto& k : t.knobs) {
        known = known || k.name == name;
        names += (names.empty() ? "" : ", ") + k.name;
      }
    };
    scan(info);
    for (const TaskInfo* t : also) scan(*t);
    if (!known) fail(info.name, "unknown knob '" + name + "' (knobs: " + names + ")");
  }
}

std::map<std::string, std::string> knobs_of(const TaskInfo& info,
                                            const std::map<std::string, std::string>& all) {
  std::map<std::string, std::string> out;
  for (const auto& k : info.knobs) {
    auto it = all.find(k.name);
    if (it != all.end()) out.insert(*it);
  }
  return out;
}

}  // namespace

const std::vector<TaskInfo>& task_registry() { return registry(); }

int64_t count_context_tokens(const Tokenizer& tokenizer, const std::string& text) {
  return static_cast<int64_t>(tokenizer.encode(text, false).size());
}

std::vector<Sample> generate_samples(const GeneratorOptions& options, const Tokenizer& tokenizer) {
  const TaskInfo* info = find_task(options.task);
  if (!info) {
    throw InputError("unknown task '" + options.task + "' (tasks: " + task_names() + ")");
  }
  const std::string& task = info->name;
  if (options.context_tokens < 1 || options.context_tokens > (int64_t{1} << 24)) {
    fail(task, "context_tokens must be in [1, 16777216], not " + std::to_string(options.context_tokens));
  }
  if (options.turns < 1 || options.turns > 1000) {
    fail(task, "turns must be in [1, 1000], not " + std::to_string(options.turns));
  }
  if (options.samples < 1 || options.samples > 100000) {
    fail(task, "samples must be in [1, 100000], not " + std::to_string(options.samples));
  }

  // mix: the two parts, their knobs split between them.
  std::vector<const TaskInfo*> parts;
  if (task == "mix") {
    const Knobs mk(*info, options.knobs);
    const std::string spec = mk.text("tasks");
    const size_t plus = spec.find('+');
    const std::string a = plus == std::string::npos ? spec : spec.substr(0, plus);
    const std::string b = plus == std::string::npos ? "" : spec.substr(plus + 1);
    const TaskInfo* ta = find_task(a);
    const TaskInfo* tb = find_task(b);
    if (!ta || !tb || a == "mix" || b == "mix" || a == b) {
      fail(task, "knob tasks must be two different tasks A+B among the generated tasks, not '" +
                     spec + "'");
    }
    parts = {ta, tb};
  }
  check_knob_names(*info, options.knobs, parts);

  std::vector<Sample> out;
  // Shared by the samples; a salt no sample index takes.
  const uint64_t run_seed = derive_seed(options.seed, ~uint64_t{0});
  for (int32_t s = 0; s < options.samples; ++s) {
    const uint64_t sample_seed = derive_seed(options.seed, static_cast<uint64_t>(s));
    Sample sample;
    sample.id = task + "-seed" + std::to_string(options.seed) + "-" + std::to_string(s);
    sample.task = task;
    if (parts.empty()) {
      const Knobs knobs(*info, options.knobs);
      const Plan plan = plan_for(task, knobs, options.turns, sample_seed, run_seed, options);
      Built b = size_to(plan, tokenizer, options.context_tokens, options.turns);
      sample.context = std::move(b.context);
      sample.turns = std::move(b.turns);
      sample.documents = std::move(b.documents);
    } else try {
      // Part A takes half the target; part B what is left after A and the separator,
      // corrected once more if the joint tokenization drifts.
      const int32_t turns_a = (options.turns + 1) / 2;
      const int32_t turns_b = options.turns / 2;
      const auto ka = knobs_of(*parts[0], options.knobs);
      const auto kb = knobs_of(*parts[1], options.knobs);
      const Knobs knobs_a(*parts[0], ka);
      const Knobs knobs_b(*parts[1], kb);
      const std::string sep = "\n\n";
      const Plan pa =
          plan_for(parts[0]->name, knobs_a, turns_a, derive_seed(sample_seed, 1), run_seed,
                   options);
      Built a = size_to(pa, tokenizer, options.context_tokens / 2, turns_a);
      Built b;
      if (turns_b > 0) {
        const Plan pb =
            plan_for(parts[1]->name, knobs_b, turns_b, derive_seed(sample_seed, 2), run_seed,
                     options);
        int64_t target_b = options.context_tokens - count_context_tokens(tokenizer, a.context + sep);
        for (int attempt = 0;; ++attempt) {
          if (target_b < 1) {
            fail(task, "context_tokens " + std::to_string(options.context_tokens) +
                           " is too small for both parts");
          }
          b = size_to(pb, tokenizer, target_b, turns_b);
          const int64_t total = count_context_tokens(tokenizer, a.context + sep + b.context);
          if (within(total, options.context_tokens) || attempt == 2) break;
          target_b += options.context_tokens - total;
        }
        sample.context = a.context + sep + b.context;
      } else {
        // One turn: only part A is asked, but the context still holds both parts.
        const Plan pb =
            plan_for(parts[1]->name, knobs_b, 1, derive_seed(sample_seed, 2), run_seed, options);
        const int64_t target_b =
            options.context_tokens - count_context_tokens(tokenizer, a.context + sep);
        if (target_b < 1) fail(task, "context_tokens is too small for both parts");
        b = size_to(pb, tokenizer, target_b, 1);
        sample.context = a.context + sep + b.context;
        b.turns.clear();
      }
      // Each turn is scored by its part's task.
      for (SampleTurn& turn : a.turns) turn.task = parts[0]->name;
      for (SampleTurn& turn : b.turns) turn.task = parts[1]->name;
      for (size_t t = 0; t < a.turns.size() || t < b.turns.size(); ++t) {
        if (t < a.turns.size()) sample.turns.push_back(a.turns[t]);
        if (t < b.turns.size()) sample.turns.push_back(b.turns[t]);
      }
      const int64_t total = count_context_tokens(tokenizer, sample.context);
      if (!within(total, options.context_tokens)) {
        fail(task, "cannot size the context to " + std::to_string(options.context_tokens) +
                       " tokens within 2% (got " + std::to_string(total) + ")");
      }
    } catch (const InputError& e) {
      const std::string what = e.what();
      if (what.rfind("task mix:", 0) == 0) throw;
      // A part's error, with the mix's context: each part gets about half the tokens.
      fail(task, std::string(e.what()) + " (each part of the mix gets about half of context_tokens " +
                     std::to_string(options.context_tokens) + ")");
    }
    out.push_back(std::move(sample));
  }
  return out;
}

}  // namespace kvbench
