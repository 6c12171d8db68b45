// niah: RULER's multi-key needle in a haystack (RULER scripts/data/synthetic/niah.py,
// niah_multikey_1) over real English prose, SCBench's retrieval family on natural text.
// The haystack is consecutive sentences of the prose corpus from a seeded paragraph on;
// K needles "One of the special magic numbers for <adjective-noun> is: <digits>." sit at
// seeded depths between sentences. Each turn asks one key with RULER's question and answer
// prefix. Distractor needles repeat an asked key with another number under another kind
// ("special magic codes"), so a model that matches only the key is caught. The sentence
// count is the sized item; the first words of the next sentence pad.
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "datasets/generator_parts.h"

namespace kvbench::generator_parts {

namespace {

struct ProseSentence {
  std::string text;
  bool ends_paragraph = false;
};

bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }

// Sentences of every paragraph, in corpus order: a paragraph is cut after ". ", "? " or
// "! " when an upper-case letter follows.
std::vector<ProseSentence> split_sentences(const ProseCorpus& corpus) {
  std::vector<ProseSentence> out;
  for (const std::string& p : corpus.paragraphs) {
    size_t start = 0;
    for (size_t i = 0; i + 2 < p.size(); ++i) {
      if ((p[i] == '.' || p[i] == '?' || p[i] == '!') && p[i + 1] == ' ' && is_upper(p[i + 2])) {
        out.push_back({p.substr(start, i + 1 - start), false});
        start = i + 2;
      }
    }
    out.push_back({p.substr(start), true});
  }
  return out;
}

// RULER draws its keys from wonderwords' adjectives and nouns; kvbench's own short lists.
constexpr const char* kAdjectives[] = {
    "amber",  "brave", "calm",   "damp",   "eager",  "faint", "gentle", "hollow", "icy",    "jolly",
    "keen",   "lush",  "mellow", "narrow", "odd",    "pale",  "quiet",  "rapid",  "silent", "tidy",
    "vivid",  "wary",  "young",  "zesty",  "bitter", "crisp", "dusty",  "early",  "fuzzy",  "grand",
    "humble", "lucky", "misty",  "noble",  "proud",  "rough", "shiny",  "tall",   "warm",   "wild"};
constexpr const char* kNouns[] = {
    "anchor", "basket",  "candle", "desert", "engine",  "feather", "garden",  "harbor",
    "island", "jacket",  "kettle", "ladder", "meadow",  "needle",  "orchard", "pencil",
    "quarry", "river",   "saddle", "tunnel", "valley",  "window",  "bridge",  "cellar",
    "donkey", "falcon",  "glove",  "hammer", "lantern", "mirror",  "parrot",  "rocket",
    "spider", "thimble", "violin", "wagon",  "acorn",   "bucket",  "cactus",  "dolphin"};
constexpr int64_t kAdjectiveCount = sizeof(kAdjectives) / sizeof(kAdjectives[0]);
constexpr int64_t kNounCount = sizeof(kNouns) / sizeof(kNouns[0]);

// The kinds a distractor needle is marked as, in turn.
constexpr const char* kDistractorKinds[] = {"codes", "dates", "counts"};

constexpr int64_t kPadWords = 40;

std::string needle(const std::string& kind, const std::string& key, const std::string& value) {
  return "One of the special magic " + kind + " for " + key + " is: " + value + ".";
}

}  // namespace

Plan plan_niah(const Knobs& knobs, int32_t turns, uint64_t seed, const ProseCorpus& corpus) {
  int64_t needles = knobs.integer("needles", 0, 200);
  const int64_t depth_from = knobs.integer("depth_from", 0, 100);
  const int64_t depth_to = knobs.integer("depth_to", 0, 100);
  const int64_t digits = knobs.integer("value_digits", 3, 12);
  const int64_t distractors = knobs.integer("distractors", 0, 3);
  if (needles == 0) needles = turns;
  if (needles < turns) {
    fail("niah", "knob needles " + std::to_string(needles) + " is fewer than the " +
                     std::to_string(turns) + " turns (each turn asks a different key)");
  }
  if (depth_from > depth_to) {
    fail("niah", "knob depth_from " + std::to_string(depth_from) + " is after depth_to " +
                     std::to_string(depth_to));
  }
  const auto sentences = std::make_shared<std::vector<ProseSentence>>(split_sentences(corpus));
  if (sentences->empty()) fail("niah", "corpus " + corpus.name + " has no prose");
  Plan plan;
  plan.task = "niah";
  plan.min_items = 1;
  plan.pad_max = kPadWords;
  plan.build = [=](int64_t n, int64_t pad) {
    Rng rng(seed);
    const int64_t total = static_cast<int64_t>(sentences->size());
    // The haystack starts at a paragraph's first sentence.
    int64_t first = static_cast<int64_t>(rng.below(static_cast<uint64_t>(total)));
    while (first > 0 && !(*sentences)[static_cast<size_t>(first - 1)].ends_paragraph) --first;
    // Keys and values, all distinct.
    std::vector<std::string> keys, values;
    std::set<std::string> used;
    for (int64_t k = 0; k < needles; ++k) {
      std::string key;
      do {
        key = std::string(kAdjectives[rng.below(kAdjectiveCount)]) + "-" +
              kNouns[rng.below(kNounCount)];
      } while (!used.insert(key).second);
      keys.push_back(key);
    }
    auto fresh_value = [&] {
      std::string v;
      do {
        v = std::to_string(rng.between(1, 9));
        for (int64_t d = 1; d < digits; ++d) v += static_cast<char>('0' + rng.below(10));
      } while (!used.insert(v).second);
      return v;
    };
    for (int64_t k = 0; k < needles; ++k) values.push_back(fresh_value());
    // Every needle, then the asked ones' distractors, each at its own seeded depth: the
    // sentence boundary at depth% of the haystack's n sentences.
    struct Placed {
      int64_t at;
      std::string text;
    };
    std::vector<Placed> placed;
    auto place = [&](std::string text) {
      const int64_t permille = rng.between(depth_from * 10, depth_to * 10);
      placed.push_back({(permille * n + 500) / 1000, std::move(text)});
    };
    for (int64_t k = 0; k < needles; ++k) place(needle("numbers", keys[k], values[k]));
    const std::vector<int64_t> asked = choose_distinct(rng, needles, turns);
    for (int64_t k : asked) {
      for (int64_t d = 0; d < distractors; ++d) {
        place(needle(kDistractorKinds[d], keys[static_cast<size_t>(k)], fresh_value()));
      }
    }
    std::stable_sort(placed.begin(), placed.end(),
                     [](const Placed& a, const Placed& b) { return a.at < b.at; });
    std::string hay;
    size_t next = 0;
    auto put = [&](const std::string& sentence, bool ends_paragraph) {
      if (!hay.empty()) hay += hay.back() == '\n' ? "" : " ";
      hay += sentence;
      if (ends_paragraph) hay += "\n\n";
    };
    for (int64_t i = 0; i <= n; ++i) {
      while (next < placed.size() && placed[next].at == i) put(placed[next++].text, false);
      if (i == n) break;
      const ProseSentence& s = (*sentences)[static_cast<size_t>((first + i) % total)];
      put(s.text, s.ends_paragraph);
    }
    if (pad > 0) {  // the first words of the next sentence
      const std::string& s = (*sentences)[static_cast<size_t>((first + n) % total)].text;
      size_t cut = 0;
      for (int64_t w = 0; w < pad && cut != std::string::npos; ++w) cut = s.find(' ', cut + 1);
      std::string words = s.substr(0, cut);
      if (!words.empty() && words.back() != '.') words += ".";
      put(words, false);
    }
    while (!hay.empty() && (hay.back() == '\n' || hay.back() == ' ')) hay.pop_back();
    Built b;
    b.context =
        "Some special magic numbers are hidden within the following text. Make sure to "
        "memorize it. I will quiz you about the numbers afterwards.\n" +
        hay;
    for (int64_t k : asked) {
      const std::string& key = keys[static_cast<size_t>(k)];
      b.turns.push_back(make_turn("What is the special magic number for " + key +
                                      " mentioned in the provided text? The special magic "
                                      "number for " +
                                      key + " mentioned in the provided text is",
                                  {values[static_cast<size_t>(k)]}));
    }
    return b;
  };
  return plan;
}

}  // namespace kvbench::generator_parts
