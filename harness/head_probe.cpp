#include "harness/head_probe.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <stdexcept>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/files.h"
#include "common/input_error.h"
#include "common/sha256.h"
#include "harness/model/tokenizer.h"
#include "kernels/cpu/scores.h"

namespace kvbench {
namespace {

using nlohmann::json;

// Changes whenever the probe's texts or scoring change, so older cache files are not read.
constexpr const char* kProbeVersion = "needle-v1";

constexpr int kProbes = 4;

const char* const kFiller[] = {
    "The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
    "There and back again.", "The river runs past the old mill.",
    "A quiet wind moves over the hills.", "The market opens early on Mondays.",
    "Children walk to school along the lane.", "The baker lights the oven before dawn.",
};

// Observes the forwards of one probe: while `recording`, adds per (layer, query head) the
// attention mass the queries put on the needle's positions [begin, end).
class NeedleAttention : public TokenPolicy {
 public:
  NeedleAttention(int32_t n_layers, int32_t begin, int32_t end)
      : begin_(begin), end_(end), mass_(static_cast<size_t>(n_layers)) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<NeedleAttention>(*this);
  }
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    if (!recording) return;
    std::vector<float> scores(static_cast<size_t>(query.n_heads) * kv.n_tokens, 0.f);
    attention_scores_cpu(query, kv, scores.data());
    std::vector<double>& mass = mass_[layer];
    mass.assign(static_cast<size_t>(query.n_heads), 0.0);
    const int32_t group = query.n_heads / kv.n_kv_heads;
    for (int32_t h = 0; h < query.n_heads; ++h) {
      const int32_t* positions = kv.positions + (h / group) * kv.capacity;
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        if (positions[t] >= begin_ && positions[t] < end_) mass[h] += scores[h * kv.n_tokens + t];
      }
      mass[h] /= query.n_queries;
    }
  }
  bool plan(int32_t, const DenseKv&, CachePhase, RetainPlan&) override { return false; }

  bool recording = false;
  const std::vector<double>& mass(int32_t layer) const { return mass_[layer]; }

 private:
  int32_t begin_, end_;
  std::vector<std::vector<double>> mass_;  // [layer][query head]
};

std::vector<int32_t> tokens_of(const Tokenizer& tokenizer, const std::string& text, bool first) {
  std::vector<int32_t> tokens = tokenizer.encode(text, false);
  if (!first && !tokens.empty() && tokens.front() == tokenizer.bos_id()) {
    tokens.erase(tokens.begin());
  }
  return tokens;
}

std::string filler(std::mt19937& rng, int n) {
  std::uniform_int_distribution<size_t> pick(0, std::size(kFiller) - 1);
  std::string text;
  for (int i = 0; i < n; ++i) text += std::string(kFiller[pick(rng)]) + " ";
  return text;
}

std::filesystem::path cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return std::filesystem::path(xdg) / "kvbench" / "heads";
  }
  const char* home = std::getenv("HOME");
  return std::filesystem::path(home && *home ? home : ".") / ".cache" / "kvbench" / "heads";
}

// One needle probe: filler with a pass-key sentence at [needle_begin, needle_end), the
// question, and the teacher-forced answer (its first row the question's last token).
struct Probe {
  std::vector<int32_t> tokens;
  int32_t needle_begin = 0, needle_end = 0;
  std::vector<int32_t> answer;
};

std::vector<Probe> make_probes(const Tokenizer& tokenizer, const ProbeTexts& texts) {
  std::mt19937 rng(texts.seed);
  const int sentences = texts.filler_sentences;
  std::uniform_int_distribution<int> digits(10000, 99999);
  std::vector<Probe> probes;
  for (int p = 0; p < kProbes; ++p) {
    Probe probe;
    const std::string key = std::to_string(digits(rng));
    const int before = sentences * (p + 1) / (kProbes + 1);  // depth 20%, 40%, ...
    std::vector<int32_t>& tokens = probe.tokens;
    tokens = tokens_of(tokenizer, filler(rng, before), true);
    probe.needle_begin = static_cast<int32_t>(tokens.size());
    for (int32_t t : tokens_of(tokenizer, "The pass key is " + key + ". Remember it. ", false)) {
      tokens.push_back(t);
    }
    probe.needle_end = static_cast<int32_t>(tokens.size());
    for (int32_t t : tokens_of(tokenizer, filler(rng, sentences - before), false)) {
      tokens.push_back(t);
    }
    for (int32_t t : tokens_of(tokenizer, "\nWhat is the pass key? The pass key is", false)) {
      tokens.push_back(t);
    }
    // The rows that read the answer out: the question's last token and the answer's.
    probe.answer = {tokens.back()};
    tokens.pop_back();
    for (int32_t t : tokens_of(tokenizer, " " + key, false)) probe.answer.push_back(t);
    probes.push_back(std::move(probe));
  }
  return probes;
}

}  // namespace

int64_t probe_context_tokens(const Tokenizer& tokenizer, const ProbeTexts& texts) {
  int64_t total = 0;
  for (const Probe& probe : make_probes(tokenizer, texts)) {
    total += static_cast<int64_t>(probe.tokens.size() + probe.answer.size());
  }
  return total / kProbes;
}

int filler_sentences_for(const Tokenizer& tokenizer, int64_t context_tokens, uint32_t seed) {
  // Scaled by the probes' measured length, twice: a sentence's tokens depend on its
  // neighbours (a leading space), and the needle and the question add about 25.
  ProbeTexts texts;
  texts.seed = seed;
  for (int round = 0; round < 2; ++round) {
    const double per_sentence =
        static_cast<double>(probe_context_tokens(tokenizer, texts) - 25) / texts.filler_sentences;
    texts.filler_sentences = std::max(
        4, static_cast<int>(std::lround(static_cast<double>(context_tokens - 25) / per_sentence)));
  }
  return texts.filler_sentences;
}

std::vector<float> probe_retrieval_heads(const LlamaModel& model, const ProbeTexts& texts) {
  if (model.device() != ModelDevice::Cpu) {
    throw InputError("the retrieval-head probe runs on the CPU only");
  }
  const KvShape shape = model.kv_shape();
  std::vector<double> total(static_cast<size_t>(shape.n_layers) * shape.n_kv_heads, 0.0);
  for (const Probe& probe : make_probes(model.tokenizer(), texts)) {
    auto observer =
        std::make_unique<NeedleAttention>(shape.n_layers, probe.needle_begin, probe.needle_end);
    NeedleAttention& needle = *observer;
    KvCache cache(shape, make_dense_layers(shape), std::move(observer));
    cache.reserve(static_cast<int64_t>(probe.tokens.size() + probe.answer.size()));
    model.forward(probe.tokens, cache);
    needle.recording = true;
    model.forward(probe.answer, cache);
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      const std::vector<double>& mass = needle.mass(l);
      const int32_t group = static_cast<int32_t>(mass.size()) / shape.n_kv_heads;
      for (size_t h = 0; h < mass.size(); ++h) {
        total[l * shape.n_kv_heads + h / group] += mass[h] / group / kProbes;
      }
    }
  }
  return std::vector<float>(total.begin(), total.end());
}

std::string head_scores_tsv(const std::vector<float>& scores, int32_t n_layers,
                            int32_t n_kv_heads) {
  if (scores.size() != static_cast<size_t>(n_layers) * static_cast<size_t>(n_kv_heads)) {
    throw std::invalid_argument("head_scores_tsv: " + std::to_string(scores.size()) +
                                " scores for " + std::to_string(n_layers) + " x " +
                                std::to_string(n_kv_heads) + " heads");
  }
  std::string out;
  char value[32];
  for (int32_t l = 0; l < n_layers; ++l) {
    for (int32_t h = 0; h < n_kv_heads; ++h) {
      std::snprintf(value, sizeof value, "%.6g", static_cast<double>(scores[l * n_kv_heads + h]));
      out += (h == 0 ? "" : "\t") + std::string(value);
    }
    out += "\n";
  }
  return out;
}

std::vector<float> cached_retrieval_heads(const LlamaModel& model, const std::string& model_path) {
  const KvShape shape = model.kv_shape();
  const size_t heads = static_cast<size_t>(shape.n_layers) * shape.n_kv_heads;
  const std::string sha = sha256_model(model_path);
  const std::filesystem::path path = cache_dir() / (sha + ".json");
  std::error_code error;
  if (std::filesystem::exists(path, error)) {
    // Read as any input: a FIFO or a device there is refused (one line, exit 2), not
    // waited on; a torn, foreign or older file is probed again and replaced.
    const std::string text = read_regular_file(path.string(), "head-probe cache", 1 << 20);
    const json root = json::parse(text, nullptr, false);
    if (root.is_object() && root.value("probe", json()) == kProbeVersion &&
        root.value("model_sha256", json()) == sha && root.value("scores", json()).is_array() &&
        root["scores"].size() == heads) {
      std::vector<float> scores;
      for (const json& v : root["scores"]) {
        if (!v.is_number() || !std::isfinite(v.get<double>())) break;
        scores.push_back(v.get<float>());
      }
      if (scores.size() == heads) return scores;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<float> scores = probe_retrieval_heads(model);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "head probe: %zu KV heads scored in %.1f s", heads, seconds);
  const json root = {{"probe", kProbeVersion},
                     {"model_sha256", sha},
                     {"n_layers", shape.n_layers},
                     {"n_kv_heads", shape.n_kv_heads},
                     {"scores", scores}};
  std::filesystem::create_directories(path.parent_path(), error);
  try {
    write_file_atomically(path.string(), root.dump() + "\n", "head-probe cache");
    std::fprintf(stderr, ", cached in %s\n", path.c_str());
  } catch (const InputError& e) {
    std::fprintf(stderr, "; not cached (%s)\n", e.what());
  }
  return scores;
}

void prepare_head_retrieval(LlamaModel& model, const std::string& model_path,
                            const std::vector<ResolvedSpec>& specs) {
  if (!model.kv_shape().head_retrieval.empty()) return;
  for (const ResolvedSpec& spec : specs) {
    for (const auto& [info, params] : spec.components) {
      // A method given its heads in a file (duo_attention:pattern=FILE) needs no probe.
      const bool given = params.has("pattern");
      if (info->needs_head_retrieval && !given) {
        model.set_head_retrieval(cached_retrieval_heads(model, model_path));
        return;
      }
    }
  }
}

}  // namespace kvbench
