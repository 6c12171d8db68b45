// What cache methods cost, side by side in one run (the machine is shared and noisy):
//   BM_PrefillMethod      end-to-end 4K-token prefill + compression of the real model, per
//                         method (full is the baseline);
//   BM_ScoreCompact       just the policy's work on that prefill — observing every layer's
//                         queries (for H2O and D2O, what scoring in the attention pass adds
//                         to it), scoring, planning and the store's compaction — replayed
//                         from a captured 4K prefill; pct_of_prefill relates it to the
//                         full prefill measured in the same process (goal: under 10%);
//                         every registered eviction method at budget 1024 (its defaults
//                         otherwise), except those whose scoring runs the model itself
//                         (KVzip's reconstruction forward, FastKV's token propagation),
//                         which a replay of the queries cannot reproduce;
//   BM_DecodeStep         one decode step's cache work over 30 layers (append, attention
//                         through the store, the policy's observe/evict) at 8K context:
//                         full vs methods at budget 1K (goal: at least 6x faster).
// Model: $KVBENCH_MODEL, else the bundled SmolLM2-135M-Instruct Q4_1.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_model.h"
#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/shared_prefill.h"
#include "methods/builtin_methods.h"

using namespace kvbench;
using kvbench::bench::model_or_skip;
using kvbench::bench::some_tokens;

namespace {

constexpr int64_t kPrefillTokens = 4096;
constexpr int64_t kMaxDecodeSteps = 200;  // BM_DecodeStep iterations
const char* const kMethods[] = {"snapkv:budget=1024", "pyramidkv:budget=1024", "h2o:budget=1024",
                                "tova:budget=1024",   "streamingllm:budget=1024",
                                "knorm:budget=1024",  "keydiff:budget=1024", "kvmerger:budget=1024"};
// Methods that keep every token (or pack it) and change how a decode step reads: only
// BM_DecodeStep measures them, beside the evicting ones.
const char* const kReadMethods[] = {"kivi:bits=2", "kivi:bits=4", "quest:budget=1024",
                                    "snapkv:budget=1024+kivi:bits=2",
                                    "quest:budget=512+kivi:bits=4"};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Records every layer's query chunks during a prefill (and plans nothing).
class QueryRecorder : public TokenPolicy {
 public:
  struct Chunk {
    std::vector<float> q;
    std::vector<int32_t> positions;
    AttentionQuery query() const {
      return AttentionQuery{q.data(), positions.data(), nullptr,
                            static_cast<int32_t>(positions.size()), n_heads, scale};
    }
    int32_t n_heads = 0;
    float scale = 1;
  };
  std::vector<std::vector<Chunk>> chunks;  // [layer][chunk]

  explicit QueryRecorder(int32_t n_layers) : chunks(n_layers) {}
  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<QueryRecorder>(*this);
  }
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    Chunk c;
    c.q.assign(query.q, query.q + int64_t{query.n_queries} * query.n_heads * kv.head_dim);
    c.positions.assign(query.q_positions, query.q_positions + query.n_queries);
    c.n_heads = query.n_heads;
    c.scale = query.scale;
    chunks[layer].push_back(std::move(c));
  }
  bool plan(int32_t, const DenseKv&, CachePhase, RetainPlan&) override { return false; }
};

// A 4K-token prefill of the real model, timed with the full cache, with what every layer
// stored (in append layout) and the queries it attended with.
struct CapturedPrefill {
  double full_prefill_s = 0;
  std::vector<std::vector<float>> k, v;  // [layer][token, kv_head, head_dim]
  std::unique_ptr<QueryRecorder> recorder;
};

const CapturedPrefill& captured(const LlamaModel& model) {
  static CapturedPrefill c = [&] {
    CapturedPrefill out;
    const auto tokens = some_tokens(kPrefillTokens, 7);
    const KvShape shape = model.kv_shape();
    // Best of two timed full prefills: the baseline the policy's work is a fraction of.
    out.full_prefill_s = 1e30;
    for (int i = 0; i < 2; ++i) {
      KvCache cache = make_full_cache(shape);
      cache.reserve(kPrefillTokens);
      const auto t0 = std::chrono::steady_clock::now();
      model.forward(tokens, cache);
      out.full_prefill_s = std::min(out.full_prefill_s, seconds_since(t0));
    }
    auto recorder = std::make_unique<QueryRecorder>(shape.n_layers);
    QueryRecorder* rec = recorder.get();
    KvCache cache(shape, make_dense_layers(shape), std::move(recorder));
    model.forward(tokens, cache);
    out.recorder = std::make_unique<QueryRecorder>(shape.n_layers);
    out.recorder->chunks = std::move(rec->chunks);  // ~300 MB of queries: move, not copy
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      const DenseKv kv = cache.layer(l).view();
      std::vector<float> k(kv.n_tokens * kv.n_kv_heads * kv.head_dim), v(k.size());
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
          for (int32_t d = 0; d < kv.head_dim; ++d) {
            const int64_t src = (h * kv.capacity + t) * kv.head_dim + d;
            const int64_t dst = (t * kv.n_kv_heads + h) * kv.head_dim + d;
            k[dst] = kv.k[src];
            v[dst] = kv.v[src];
          }
        }
      }
      out.k.push_back(std::move(k));
      out.v.push_back(std::move(v));
    }
    return out;
  }();
  return c;
}

void BM_PrefillMethod(benchmark::State& state, const std::string& spec) {
  const LlamaModel* model = model_or_skip(state);
  if (!model) return;
  const ResolvedSpec resolved = resolve_method_spec(spec);
  const auto tokens = some_tokens(kPrefillTokens, 7);
  for (auto _ : state) {
    KvCache cache = make_cache(resolved, model->kv_shape());
    cache.reserve(kPrefillTokens);
    model->forward(tokens, cache);
    cache.end_context();
    benchmark::DoNotOptimize(cache.bytes_resident());
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(kPrefillTokens) *
                                                   state.iterations(),
                                               benchmark::Counter::kIsRate);
}

// The model's shape, with a fixed ranking of its KV heads for a method that ranks heads by
// retrieval (duo_attention): the driver would probe the model for it, and the policy's cost
// does not depend on which heads rank first.
KvShape shape_for(const ResolvedSpec& resolved, KvShape shape) {
  if (resolved.components[0].first->needs_head_retrieval) {
    shape.head_retrieval.resize(static_cast<size_t>(shape.n_layers) * shape.n_kv_heads);
    for (size_t i = 0; i < shape.head_retrieval.size(); ++i) {
      shape.head_retrieval[i] = static_cast<float>((i * 7919) % 101) / 101.0f;
    }
  }
  return shape;
}

struct ObserveScratch {
  std::vector<float> out, scores;
};

// Seconds the policy's scoring of one layer's forward adds to it, as KvCache::attend runs it:
// observe; or, for a policy scored by every row's attention (TokenPolicy::ScoredRows::All),
// the attention pass that also scores (attention_dense_scored_cpu) less the plain one it
// replaces, plus observe_scores.
double observe_time(TokenPolicy& policy, int32_t layer, AttentionQuery query, const DenseKv& kv,
                    ObserveScratch& w) {
  if (policy.scored_rows() != TokenPolicy::ScoredRows::All) {
    const auto t0 = std::chrono::steady_clock::now();
    policy.observe(layer, query, kv);
    return seconds_since(t0);
  }
  const double extra_s = scored_pass_extra_seconds(query, kv, w.out, w.scores);
  const auto t0 = std::chrono::steady_clock::now();
  policy.observe_scores(layer, w.scores.data(), query.n_heads, kv.n_tokens);
  return extra_s + seconds_since(t0);
}

// The policy's share of a prefill: appends are done untimed, then observe (scoring), plan
// and retain (compaction) are timed exactly where KvCache calls them.
void BM_ScoreCompact(benchmark::State& state, const std::string& spec) {
  const LlamaModel* model = model_or_skip(state);
  if (!model) return;
  const CapturedPrefill& cap = captured(*model);
  const ResolvedSpec resolved = resolve_method_spec(spec);
  const KvShape shape = model->kv_shape();
  const int64_t row = int64_t{shape.n_kv_heads} * shape.head_dim;
  const size_t n_chunks = cap.recorder->chunks[0].size();
  double total_s = 0;
  for (auto _ : state) {
    std::unique_ptr<TokenPolicy> policy = resolved.components[0].first->make_policy(
        resolved.components[0].second, shape_for(resolved, shape));
    std::vector<std::unique_ptr<LayerKv>> stores = make_dense_layers(shape);
    for (auto& s : stores) s->reserve(kPrefillTokens);
    double policy_s = 0;
    ObserveScratch scratch;
    RetainPlan plan;
    auto compress = [&](CachePhase phase) {
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        if (policy->plan(l, stores[l]->view(), phase, plan)) {
          stores[l]->retain(plan);
          policy->retained(l, plan);
        }
      }
    };
    int64_t fed = 0;
    for (size_t c = 0; c < n_chunks; ++c) {
      const auto& first = cap.recorder->chunks[0][c];
      const int64_t n = static_cast<int64_t>(first.positions.size());
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        const auto& chunk = cap.recorder->chunks[l][c];
        stores[l]->append(cap.k[l].data() + fed * row, cap.v[l].data() + fed * row,
                          chunk.positions.data(), n);
        policy_s += observe_time(*policy, l, chunk.query(), stores[l]->view(), scratch);
      }
      fed += n;
      const auto t0 = std::chrono::steady_clock::now();
      compress(CachePhase::ContextChunk);
      policy_s += seconds_since(t0);
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (policy->reads_context_end()) {  // as KvCache::end_context
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        if (!policy->done(l)) policy->context_ending(l, stores[l]->view());
      }
    }
    compress(CachePhase::ContextEnd);
    policy_s += seconds_since(t0);
    state.SetIterationTime(policy_s);
    total_s += policy_s;
    state.counters["kept"] = static_cast<double>(stores[0]->n_tokens());
  }
  state.counters["pct_of_prefill"] =
      100.0 * total_s / std::max<int64_t>(1, state.iterations()) / cap.full_prefill_s;
  state.counters["full_prefill_ms"] = cap.full_prefill_s * 1e3;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

// One decode step's cache work at 8K context, SmolLM2's shape (30 layers, 9 query heads,
// 3 KV heads, head_dim 64), random KV: full holds 8192 tokens per layer; the methods
// compressed the same 8192 to their budget at end_context (scored by 32 window queries).
void BM_DecodeStep(benchmark::State& state, const std::string& spec) {
  const KvShape shape{30, 3, 64};
  const int32_t n_heads = 9;
  const int64_t context = 8192, window = 32;
  KvCache cache = make_cache(spec, shape);
  const int64_t row = int64_t{shape.n_kv_heads} * shape.head_dim;
  const auto k = random_floats(context * row, 1), v = random_floats(context * row, 2);
  std::vector<int32_t> positions(context);
  for (int64_t t = 0; t < context; ++t) positions[t] = static_cast<int32_t>(t);
  const auto wq = random_floats(window * n_heads * shape.head_dim, 3);
  std::vector<float> out(wq.size());
  const float scale = 1.f / std::sqrt(static_cast<float>(shape.head_dim));
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    cache.append(l, k.data(), v.data(), positions.data(), context);
    cache.attend(l, AttentionQuery{wq.data(), positions.data() + context - window, out.data(),
                                   static_cast<int32_t>(window), n_heads, scale});
  }
  cache.advance(static_cast<int32_t>(context));
  cache.end_context();
  // Room for the timed steps, so no step pays a reallocation; the KV reported is what the
  // compressed cache holds before that headroom.
  const double kv_mib = cache.bytes_resident() / 1048576.0;
  cache.reserve_more(kMaxDecodeSteps);

  const auto q = random_floats(n_heads * shape.head_dim, 4);
  const auto k1 = random_floats(row, 5), v1 = random_floats(row, 6);
  std::vector<float> o(q.size());
  int32_t position = static_cast<int32_t>(context);
  for (auto _ : state) {
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      cache.append(l, k1.data(), v1.data(), &position, 1);
      cache.attend(l, AttentionQuery{q.data(), &position, o.data(), 1, n_heads, scale});
    }
    cache.advance(1);
    ++position;
  }
  state.counters["tokens_per_layer"] = static_cast<double>(cache.layer(0).n_tokens());
  state.counters["KV_MiB"] = kv_mib;
  state.counters["read_MiB"] = cache.stats().bytes_read_last_forward / 1048576.0;
}

// Every registered eviction method whose work a replay of the prefill's queries measures,
// at budget 1024 where it has a budget.
std::vector<std::string> score_compact_specs() {
  std::vector<std::string> specs;
  for (const MethodInfo& info : method_registry()) {
    if (info.kind != MethodKind::Eviction || !info.make_policy || info.propagates_tokens) continue;
    bool has_budget = false;
    for (const ParamInfo& p : info.params) has_budget |= p.name == "budget";
    const std::string spec = info.name + (has_budget ? ":budget=1024" : "");
    const ResolvedSpec resolved = resolve_method_spec(spec);
    // Built on a bare shape only to ask how it scores; a policy that needs what the model
    // adds to its shape (criticalkv's W_o) cannot be built here and is not a reconstruction.
    try {
      const KvShape bare = shape_for(resolved, KvShape{30, 3, 64});
      if (info.make_policy(resolved.components[0].second, bare)->scores_by_reconstruction())
        continue;
    } catch (const InputError&) {
    }
    specs.push_back(spec);
  }
  return specs;
}

// Registered methods only: a method still being written is not benchmarked.
bool registered(const std::string& spec) {
  return find_method(spec.substr(0, spec.find(':'))) != nullptr;
}

void register_all() {
  benchmark::RegisterBenchmark("BM_PrefillMethod/full", BM_PrefillMethod, std::string("full"))
      ->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();
  for (const char* spec : {"snapkv:budget=1024", "h2o:budget=1024", "d2o:budget=1024"}) {
    if (!registered(spec)) continue;
    benchmark::RegisterBenchmark(("BM_PrefillMethod/" + std::string(spec)).c_str(),
                                 BM_PrefillMethod, std::string(spec))
        ->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();
  }
  for (const std::string& spec : score_compact_specs()) {
    benchmark::RegisterBenchmark(("BM_ScoreCompact/" + spec).c_str(), BM_ScoreCompact, spec)
        ->Unit(benchmark::kMillisecond)->Iterations(3)->UseManualTime();
  }
  benchmark::RegisterBenchmark("BM_DecodeStep/full", BM_DecodeStep, std::string("full"))
      ->Unit(benchmark::kMillisecond)->Iterations(kMaxDecodeSteps)->UseRealTime();
  std::vector<const char*> decode_methods(std::begin(kMethods), std::end(kMethods));
  decode_methods.insert(decode_methods.end(), std::begin(kReadMethods), std::end(kReadMethods));
  for (const char* spec : decode_methods) {
    if (!registered(spec)) continue;
    benchmark::RegisterBenchmark(("BM_DecodeStep/" + std::string(spec)).c_str(), BM_DecodeStep,
                                 std::string(spec))
        ->Unit(benchmark::kMillisecond)->Iterations(kMaxDecodeSteps)->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  kvbench::register_builtin_methods();
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
