// Invariants every registered cache method must hold, run through the tiny random-weight
// model (tests/gguf_writer.h) so they cover the real forward path:
//   - never above its budget once it has compressed (decode-time evictors: after every step);
//   - a budget at least the context is exact: logits bit-identical to the full cache;
//   - `full` from the registry is bit-identical to the plain model path;
//   - bytes resident fall in proportion to the tokens dropped;
//   - a clone decodes without touching the original.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "harness/model/llama_model.h"
#include "harness/reconstruction.h"
#include "tests/gguf_writer.h"

using namespace kvbench;

namespace {

constexpr int kLayers = 4;
constexpr int kContext = 300;  // tokens of shared context
constexpr int kDecode = 12;    // single-token steps after the context

const LlamaModel& tiny_model() {
  static std::unique_ptr<LlamaModel> model = [] {
    testing::TinyLlamaSpec spec;
    spec.n_layer = kLayers;
    spec.context_length = 1024;
    const std::string path = testing::temp_path("tiny_invariants.gguf");
    testing::write_tiny_llama_gguf(path, spec);
    auto m = LlamaModel::load(path);
    m->prefill_chunk = 128;  // several context chunks: block-wise methods see them
    // duo_attention's head map, fixed and synthetic (no probe runs on this random model):
    // every cache built from kv_shape() carries it.
    std::vector<float> heads(static_cast<size_t>(kLayers) * spec.n_head_kv);
    for (size_t i = 0; i < heads.size(); ++i) heads[i] = static_cast<float>(i * 37 % 11);
    m->set_head_retrieval(heads);
    return m;
  }();
  return *model;
}

std::vector<int32_t> context_tokens() {
  std::vector<int32_t> tokens;
  uint32_t x = 12345;
  for (int i = 0; i < kContext + kDecode; ++i) {
    x = x * 1664525u + 1013904223u;
    tokens.push_back(3 + static_cast<int32_t>((x >> 8) % 256));  // byte tokens
  }
  return tokens;
}

// Methods that evict after every forward, so they hold their budget during decode too.
bool evicts_during_decode(const std::string& name) {
  static const std::set<std::string> names = {"streamingllm", "h2o", "tova", "sage_kv",
                                              "lazy_eviction", "lacache", "d2o"};
  return names.count(name) > 0;
}

// Decode tokens a decode-time evictor may hold over its budget between evictions: LazyEviction
// evicts once every `window` forwards (spec_for sets window=8), so up to window - 1.
int64_t decode_lag(const std::string& name) { return name == "lazy_eviction" ? 8 - 1 : 0; }

// Parameters that make a generic budget test meaningful for `m`: knorm's skipped layers
// off, SnapKV-family windows inside the budget.
std::string spec_for(const MethodInfo& m, const std::string& budget) {
  std::string spec = m.name + ":" + budget;
  for (const ParamInfo& p : m.params) {
    if (p.name == "skip") spec += ",skip=0";
    if (p.name == "window") spec += ",window=8";
    // SimLayerKV's non-lazy layers keep the whole context by design: threshold 0 makes
    // every layer lazy (the authors' StreamingLLM setting), so the budget applies to all.
    if (m.name == "simlayerkv" && p.name == "threshold") spec += ",threshold=0";
    // LaCache's default span (16) covers all 4 layers here, which leaves no ladder.
    if (m.name == "lacache" && p.name == "span") spec += ",span=2";
    // DuoAttention's streaming window (64 + 256 by default) inside the budgets tested here.
    if (m.name == "duo_attention" && p.name == "sink") spec += ",sink=4,recent=12";
    // A streamed prefill needs a token budget; the dense one is covered by the others.
    if (p.name == "prefill" && budget.rfind("budget=", 0) == 0) spec += ",prefill=stream,chunk=64";
  }
  return spec;
}

struct Run {
  std::vector<std::vector<float>> logits;  // context end, then each decode step
  std::vector<CacheStats> stats;           // same moments
  std::vector<int64_t> store_bytes;        // bytes of the layers' stores alone, same moments
};

void record(Run& r, const KvCache& cache, std::vector<float> logits) {
  r.logits.push_back(std::move(logits));
  r.stats.push_back(cache.stats());
  int64_t bytes = 0;
  for (int32_t l = 0; l < cache.shape().n_layers; ++l) bytes += cache.layer(l).bytes_resident();
  r.store_bytes.push_back(bytes);
}

// The block a method wants the context fed in (KeyDiff's block-wise prefill), else all.
int64_t context_block(const KvCache& cache) {
  return cache.policy() && cache.policy()->context_block() > 0 ? cache.policy()->context_block()
                                                               : kContext;
}

// Feeds the context in blocks of `block` tokens, ends it, decodes one token at a time.
Run run(KvCache& cache, int64_t block) {
  const LlamaModel& model = tiny_model();
  const std::vector<int32_t> tokens = context_tokens();
  const std::vector<int32_t> context(tokens.begin(), tokens.begin() + kContext);
  cache.reserve(kContext);
  Run r;
  std::vector<float> logits;
  for (int64_t start = 0; start < kContext; start += block) {
    const int64_t end = std::min<int64_t>(kContext, start + block);
    logits = model.forward(std::vector<int32_t>(context.begin() + start, context.begin() + end),
                           cache);
  }
  score_by_reconstruction(model, cache, context, 0, "\n");  // KVzip's forwards; else nothing
  cache.end_context();
  record(r, cache, logits);
  for (int i = 0; i < kDecode; ++i) record(r, cache, model.decode(tokens[kContext + i], cache));
  return r;
}

// Every eviction method, and each one an allocation method can split the budget of behind
// that method ("adakv+"): the spec's prefix and the eviction method.
std::vector<std::pair<std::string, const MethodInfo*>> eviction_methods() {
  std::vector<std::pair<std::string, const MethodInfo*>> out;
  for (const MethodInfo& m : method_registry()) {
    if (m.kind != MethodKind::Eviction) continue;
    out.emplace_back("", &m);
    for (const MethodInfo& a : method_registry()) {
      if (a.kind == MethodKind::Allocation && m.make_allocated_policy) {
        out.emplace_back(a.name + "+", &m);
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("invariant: full from the registry is the plain model path, bit for bit", "[unit]") {
  KvCache plain = make_full_cache(tiny_model().kv_shape());
  KvCache registered = make_cache("full", tiny_model().kv_shape());
  const Run a = run(plain, kContext), b = run(registered, kContext);
  for (size_t i = 0; i < a.logits.size(); ++i) REQUIRE(a.logits[i] == b.logits[i]);
  CHECK(a.stats.back().bytes_resident == b.stats.back().bytes_resident);
  // And what the cache holds is what recomputing gives: each decode step's logits equal a
  // forward over the whole prefix on a fresh cache (fp32 rounding of other chunkings apart).
  const std::vector<int32_t> tokens = context_tokens();
  for (const int step : {0, kDecode - 1}) {
    KvCache fresh = make_full_cache(tiny_model().kv_shape());
    const std::vector<float> again = tiny_model().forward(
        std::vector<int32_t>(tokens.begin(), tokens.begin() + kContext + step + 1), fresh);
    const std::vector<float>& cached = a.logits[step + 1];
    REQUIRE(again.size() == cached.size());
    float worst = 0;
    for (size_t i = 0; i < again.size(); ++i) worst = std::max(worst, std::fabs(again[i] - cached[i]));
    CHECK(worst < 1e-3f);
  }
}

TEST_CASE("invariant: a budget of at least the context changes nothing", "[unit]") {
  for (const auto& [prefix, m] : eviction_methods()) {
    for (const std::string budget : {"budget=2000", "ratio=1"}) {
      // ratio=1 keeps the whole context, but decode-time evictors then hold that many.
      if (budget == "ratio=1" && evicts_during_decode(m->name)) continue;
      const std::string spec = prefix + spec_for(*m, budget);
      INFO(spec);
      KvCache cache = make_cache(spec, tiny_model().kv_shape());
      // The full cache fed in the same blocks: chunking changes fp32 rounding, not the method.
      KvCache full = make_full_cache(tiny_model().kv_shape());
      const Run reference = run(full, context_block(cache));
      const Run got = run(cache, context_block(cache));
      for (size_t i = 0; i < got.logits.size(); ++i) REQUIRE(got.logits[i] == reference.logits[i]);
      CHECK(got.stats.back().tokens_evicted == 0);
    }
  }
}

TEST_CASE("invariant: never above the budget once compressed", "[unit]") {
  for (const auto& [prefix, m] : eviction_methods()) {
    for (const int budget : {24, 100}) {
      const std::string spec = prefix + spec_for(*m, "budget=" + std::to_string(budget));
      INFO(spec);
      KvCache cache = make_cache(spec, tiny_model().kv_shape());
      const Run got = run(cache, context_block(cache));
      for (size_t step = 0; step < got.stats.size(); ++step) {
        INFO("step " << step);
        const std::vector<int64_t>& kept = got.stats[step].tokens_per_layer;
        // Prefill-only methods append later tokens uncompressed.
        const int64_t limit =
            budget + (evicts_during_decode(m->name) ? decode_lag(m->name) : step);
        if (m->name == "pyramidkv") {
          // Per-layer budgets around the average: the total is what is bounded, up to
          // KVCache-Factory's rounded-down step (less than one token per layer pair).
          int64_t total = 0;
          for (int64_t k : kept) total += k;
          CHECK(total <= kLayers * limit + kLayers * (kLayers - 1) / 2);
        } else if (m->name == "cake" || m->name == "d2o") {
          // Layer budgets that average the budget exactly (rounded down): the mean is held.
          int64_t total = 0;
          for (int64_t k : kept) total += k;
          CHECK(total <= kLayers * limit);
        } else if (m->name == "uncomp" || m->name == "kvzip") {
          // Layers and KV heads by entropy (uncomp) or one threshold over all of them (kvzip's
          // level=pair): the mean over all heads is held (each layer's count is its heads'
          // mean rounded up).
          int64_t total = 0;
          for (int64_t k : got.stats[step].tokens_per_head) total += k;
          CHECK(total <= static_cast<int64_t>(got.stats[step].tokens_per_head.size()) * limit);
        } else if (m->name == "duo_attention") {
          // Whole heads ranked over all layers: the mean over all heads is held, not each
          // layer's (retrieval heads also grow by a token per step, streaming heads do not).
          int64_t total = 0;
          for (int64_t k : kept) total += k;
          CHECK(total <= kLayers * limit);
        } else {
          for (int64_t k : kept) CHECK(k <= limit);
        }
        CHECK(got.stats[step].tokens_evicted > 0);
      }
    }
  }
}

TEST_CASE("invariant: bytes resident fall in proportion to the tokens dropped", "[unit]") {
  KvCache full = make_full_cache(tiny_model().kv_shape());
  const CacheStats full_stats = run(full, kContext).stats.front();
  const double per_token = static_cast<double>(full_stats.bytes_resident) / (kLayers * kContext);
  for (const auto& [prefix, m] : eviction_methods()) {
    const std::string spec = prefix + spec_for(*m, "ratio=0.25");
    INFO(spec);
    KvCache cache = make_cache(spec, tiny_model().kv_shape());
    const Run got = run(cache, context_block(cache));
    const CacheStats& s = got.stats.front();  // right after the context was compressed
    const int64_t store_bytes = got.store_bytes.front();
    // Tokens per layer and KV head, summed over layers (heads of their own counted exactly).
    double kept = 0;
    const double heads = static_cast<double>(s.tokens_per_head.size()) / kLayers;
    for (int64_t k : s.tokens_per_head) kept += static_cast<double>(k) / heads;
    CHECK(kept <= kLayers * (kContext / 4 + 1));
    // The store holds exactly what it keeps: no slack left behind by the drop...
    CHECK(store_bytes == Approx(per_token * kept).epsilon(1e-9));
    // ...and per-token policy state (scores) adds at most a fifth on this tiny head_dim.
    CHECK(s.bytes_resident <= 1.2 * per_token * kept);
    CHECK(s.bytes_resident < 0.3 * full_stats.bytes_resident);
  }
}

TEST_CASE("invariant: a clone decodes without touching the original", "[unit]") {
  for (const auto& [prefix, m] : eviction_methods()) {
    const std::string spec = prefix + spec_for(*m, "budget=40");
    INFO(spec);
    KvCache a = make_cache(spec, tiny_model().kv_shape());
    KvCache b = make_cache(spec, tiny_model().kv_shape());
    run(a, context_block(a));
    run(b, context_block(b));
    KvCache branch = a.clone();
    for (int i = 0; i < 5; ++i) tiny_model().forward({7 + i}, branch);
    // The original goes on exactly as its untouched twin.
    const std::vector<float> la = tiny_model().forward({42}, a);
    const std::vector<float> lb = tiny_model().forward({42}, b);
    REQUIRE(la == lb);
    CHECK(a.stats().tokens_per_layer == b.stats().tokens_per_layer);
  }
}
