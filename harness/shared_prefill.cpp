#include "harness/shared_prefill.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "cache/full_cache.h"
#include "common/elapsed.h"
#include "harness/model/llama_model.h"
#include "kernels/cpu/attention.h"

namespace kvbench {

namespace {

// The shared cache's policy: every method's own policy observes each layer's queries, each
// timed. It never plans: the prefill is dense, so KvCache asks no plan before the end, and
// the context never ends in the shared cache. A policy whose own cache would score it in the
// attention pass (`scored`: ScoredRows::All over the dense store, KvCache::attend_scored) is
// handed the same scores from the same kernel over the same rows, so that its fork stays bit
// for bit its own prefill, and is charged that pass less the plain one it replaces.
class ObserveForAll : public TokenPolicy {
 public:
  ObserveForAll(std::vector<TokenPolicy*> policies, std::vector<bool> scored)
      : policies_(std::move(policies)),
        scored_(std::move(scored)),
        seconds_(policies_.size(), 0.0) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    throw std::logic_error("the shared prefill's cache is never cloned");
  }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    const auto call_start = std::chrono::steady_clock::now();
    double scored_extra = -1;  // the scored pass's cost over the plain one, once a layer
    for (size_t i = 0; i < policies_.size(); ++i) {
      if (policies_[i]->done(layer)) continue;
      if (scored_[i] && scored_extra < 0) {
        scored_extra = std::max(0.0, scored_pass_extra_seconds(query, kv, out_, scores_));
      }
      const auto start = std::chrono::steady_clock::now();
      if (scored_[i]) {
        policies_[i]->observe_scores(layer, scores_.data(), query.n_heads, kv.n_tokens);
        seconds_[i] += scored_extra;
      } else {
        policies_[i]->observe(layer, query, kv);
      }
      seconds_[i] += seconds_since(start);
    }
    observing_ += seconds_since(call_start);
  }

  bool plan(int32_t, const DenseKv&, CachePhase, RetainPlan&) override { return false; }

  double seconds(size_t i) const { return seconds_[i]; }
  // Wall time spent in observe(), all policies and the scored pass's measurement together:
  // what the shared forward spent beyond a plain one. (The per-policy charges sum to more
  // when several are scored: each is charged the scored pass, which ran once.)
  double observing_seconds() const { return observing_; }

 private:
  std::vector<TokenPolicy*> policies_;
  std::vector<bool> scored_;
  std::vector<double> seconds_;
  double observing_ = 0;
  std::vector<float> out_, scores_;
};

}  // namespace

double scored_pass_extra_seconds(AttentionQuery query, const DenseKv& kv, std::vector<float>& out,
                                 std::vector<float>& scores) {
  out.resize(static_cast<size_t>(query.n_queries) * query.n_heads * kv.head_dim);
  scores.assign(static_cast<size_t>(query.n_heads) * kv.n_tokens, 0.0f);
  query.out = out.data();
  auto start = std::chrono::steady_clock::now();
  attention_dense_cpu(query, kv);
  const double plain = seconds_since(start);
  start = std::chrono::steady_clock::now();
  attention_dense_scored_cpu(query, kv, scores.data());
  return seconds_since(start) - plain;
}

struct SharedPrefill::Method {
  ResolvedSpec spec;
  std::unique_ptr<TokenPolicy> observed;  // nullptr: the method has no policy
  double observe_ms = 0;
};

SharedPrefill::SharedPrefill(const LlamaModel& model, const std::vector<int32_t>& context,
                             const std::vector<ResolvedSpec>& specs)
    : model_(model), context_tokens_(static_cast<int64_t>(context.size())) {
  const KvShape shape = model.kv_shape();
  std::vector<TokenPolicy*> observers;
  std::vector<bool> scored;
  for (const ResolvedSpec& spec : specs) {
    if (!can_share(spec, model)) {
      throw std::invalid_argument("SharedPrefill: " + spec.canonical + " cannot share a prefill");
    }
    Method m;
    m.spec = spec;
    CacheParts parts = make_cache_parts(spec, shape);
    m.observed = std::move(parts.policy);
    if (m.observed) {
      observers.push_back(m.observed.get());
      // As its own cache: dense stores (no storage method) score in the attention pass.
      scored.push_back(parts.layers.empty() &&
                       m.observed->scored_rows() == TokenPolicy::ScoredRows::All);
    }
    methods_.push_back(std::move(m));
  }
  auto fan_out = std::make_unique<ObserveForAll>(observers, scored);
  const ObserveForAll& timing = *fan_out;
  full_ = std::make_unique<KvCache>(shape, make_dense_layers(shape), std::move(fan_out));
  const auto start = std::chrono::steady_clock::now();
  full_->reserve_more(context_tokens_);
  model.forward(context, *full_);
  forward_ms_ = seconds_since(start) * 1e3;
  base_ms_ = forward_ms_ - timing.observing_seconds() * 1e3;  // the plain forward's share
  size_t observer = 0;
  for (Method& m : methods_) {
    if (m.observed) m.observe_ms = timing.seconds(observer++) * 1e3;
  }
}

SharedPrefill::~SharedPrefill() = default;

bool SharedPrefill::may_share(const ResolvedSpec& spec) {
  for (const auto& [info, params] : spec.components) {
    if (info->kind == MethodKind::Reuse || info->kind == MethodKind::Tiers ||
        info->kind == MethodKind::Pinning) {
      return false;
    }
    if (info->context_reads_store || info->store_observes_queries) return false;
    if (info->kind == MethodKind::Prefill) return false;  // its prefill is not the dense one
  }
  return true;
}

bool SharedPrefill::can_share(const ResolvedSpec& spec, const LlamaModel& model) {
  if (model.device() != ModelDevice::Cpu || !may_share(spec)) return false;
  const std::unique_ptr<TokenPolicy> policy = make_cache_parts(spec, model.kv_shape()).policy;
  // A policy that propagates only some tokens past a layer prefills its own way.
  return !policy || (policy->context_block() == 0 && policy->propagation_layer() < 0);
}

bool SharedPrefill::serves(const std::string& canonical) const {
  for (const Method& m : methods_) {
    if (m.spec.canonical == canonical) return true;
  }
  return false;
}

KvCache SharedPrefill::fork(const std::string& canonical, double* prefill_ms) const {
  for (const Method& m : methods_) {
    if (m.spec.canonical != canonical) continue;
    CacheParts parts = make_cache_parts(m.spec, model_.kv_shape());  // as make_cache
    if (parts.layers.empty()) parts.layers = make_dense_layers(model_.kv_shape());
    KvCache cache(model_.kv_shape(), std::move(parts.layers),
                  m.observed ? m.observed->clone() : nullptr, std::move(parts.reader));
    cache.load_prefill(*full_, model_.prefill_chunk, m.observed.get());
    if (prefill_ms) *prefill_ms = base_ms_ + m.observe_ms;
    return cache;
  }
  throw std::invalid_argument("SharedPrefill: no prefill ran for " + canonical);
}

bool SharedPrefill::adopt_reconstruction(const std::vector<int32_t>& span, KvCache& cache,
                                         double* ms) const {
  for (const Reconstruction& r : reconstructions_) {
    if (r.span != span || !cache.adopt_scores(*r.scored, r.peak)) continue;
    *ms = r.ms;
    ++reconstructions_adopted_;
    return true;
  }
  return false;
}

void SharedPrefill::keep_reconstruction(const std::vector<int32_t>& span, const KvCache& cache,
                                        double ms) const {
  reconstructions_.push_back({span, cache.policy()->clone(), cache.stats().bytes_peak, ms});
}

}  // namespace kvbench
