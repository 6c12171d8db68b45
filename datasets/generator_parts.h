// The parts every task generator shares (datasets/generator.cpp and the corpus tasks in
// niah.cpp and repoqa.cpp): the seeded PRNG and draws, a task's knob values, and the Plan a
// task gives the sizer. Internal to datasets/; not an interface for other layers.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/input_error.h"
#include "datasets/corpus.h"
#include "datasets/generator.h"
#include "datasets/sample.h"

namespace kvbench::generator_parts {

// ---------------------------------------------------------------------------------------
// PRNG: splitmix64 (Steele, Lea, Flood 2014), with our own bounded draws.

inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9E3779B97F4A7C15ULL;
    return splitmix64_mix(state_);
  }
  // Uniform in [0, n), n > 0 (Lemire's multiply-shift; the tiny bias is irrelevant here
  // and the result is the same everywhere).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
  int64_t between(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
  }

 private:
  uint64_t state_;
};

inline uint64_t derive_seed(uint64_t seed, uint64_t salt) {
  return splitmix64_mix(seed ^ splitmix64_mix(salt + 0x632BE59BD9B4E019ULL));
}

// The first k entries of a seeded shuffle of 0..n-1 (partial Fisher-Yates).
inline std::vector<int64_t> choose_distinct(Rng& rng, int64_t n, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = rng.between(i, n - 1);
    std::swap(idx[static_cast<size_t>(i)], idx[static_cast<size_t>(j)]);
  }
  idx.resize(static_cast<size_t>(k));
  return idx;
}

inline std::string random_string(Rng& rng, const char* alphabet, size_t alphabet_size, int64_t len) {
  std::string s(static_cast<size_t>(len), ' ');
  for (auto& c : s) c = alphabet[rng.below(alphabet_size)];
  return s;
}

[[noreturn]] inline void fail(const std::string& task, const std::string& what) {
  throw InputError("task " + task + ": " + what);
}

// A task's knob values: the defaults from the registry overridden by the options.
class Knobs {
 public:
  Knobs(const TaskInfo& info, const std::map<std::string, std::string>& given)
      : info_(info), given_(given) {}

  std::string text(const std::string& name) const {
    auto it = given_.find(name);
    if (it != given_.end()) return it->second;
    for (const auto& k : info_.knobs) {
      if (k.name == name) return k.default_value;
    }
    throw std::logic_error("generator: no knob " + name);
  }

  int64_t integer(const std::string& name, int64_t lo, int64_t hi) const {
    const std::string v = text(name);
    char* end = nullptr;
    errno = 0;
    const long long x = v.empty() ? 0 : std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || errno != 0 || *end != '\0' || x < lo || x > hi) {
      fail(info_.name, "knob " + name + " must be an integer in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], not '" + v + "'");
    }
    return x;
  }

 private:
  const TaskInfo& info_;
  const std::map<std::string, std::string>& given_;
};

// ---------------------------------------------------------------------------------------
// Builders and the sizer.

struct Built {
  std::string context;
  std::vector<SampleTurn> turns;
  std::vector<std::string> documents;  // docs_kv: the context's parts (Sample::documents)
};

inline SampleTurn make_turn(std::string input, std::vector<std::string> answers) {
  SampleTurn turn;
  turn.input = std::move(input);
  turn.answers = std::move(answers);
  return turn;
}

inline std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

struct Plan {
  std::string task;
  int64_t min_items = 0;
  int64_t pad_max = 0;  // 0: no padding item
  int64_t max_items = 0;  // the most items a corpus holds; 0: no limit
  std::function<Built(int64_t items, int64_t pad)> build;
};

// The tasks cut from the pinned corpora (datasets/corpus.h), in niah.cpp and repoqa.cpp.
Plan plan_niah(const Knobs& knobs, int32_t turns, uint64_t seed, const ProseCorpus& corpus);
// What a repoqa turn asks for: the function's name (repoqa), or the whole function as
// SCBench's RepoQA does (repoqa_function).
enum class RepoqaAnswer { name, function };
Plan plan_repoqa(const Knobs& knobs, int32_t turns, uint64_t seed, const CodeCorpus& corpus,
                 RepoqaAnswer answer);

}  // namespace kvbench::generator_parts
