// One prefill of a sample's shared context for many cache methods. A sweep runs every
// method over the same context, and the prefill is most of a unit's time at 2K tokens and
// beyond, so the context is fed once, through a full dense cache whose policy hands each
// layer's queries to every method's own policy: the observe() calls a prefill of its own
// would make, on the same KV (or, to a policy its own cache scores in the attention pass,
// KvCache::attend_scored, the same scores from the same kernel). Each method's cache is then forked from it (a copy of the
// KV appended to the method's stores as a forward appends it, a copy of its policy with
// what it observed, the prefill's read counters and peak) and, once end_context() runs,
// is bit-identical to a separate prefill.
//
// That holds for every method whose prefill is dense (TokenPolicy::context_block() == 0):
// nothing of it evicts or packs before the context ends. A streamed prefill
// (prefill=stream), reuse across requests (prefix, tiers, cacheblend: the prefill they save
// is what they measure), stores whose context attends over their rounded rows
// (MethodInfo::context_reads_store: fp16, bf16, fp8), stores that choose their layout from
// the context's queries (MethodInfo::store_observes_queries: think), policies that let only
// some tokens past a layer (TokenPolicy::propagation_layer: fastkv) and caches on a GPU
// prefill on their own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/registry.h"

namespace kvbench {

class LlamaModel;

// What scoring in the attention pass adds to one layer's forward, for a policy scored by every
// row's attention (TokenPolicy::ScoredRows::All): runs the plain pass (attention_dense_cpu)
// and the scored one (attention_dense_scored_cpu) over the query's rows, their output into
// `out`, the scores into `scores` (both sized and cleared here); returns the scored pass's
// seconds less the plain one's. The shared prefill charges it; bench_methods reports it.
double scored_pass_extra_seconds(AttentionQuery query, const DenseKv& kv, std::vector<float>& out,
                                 std::vector<float>& scores);

class SharedPrefill {
 public:
  // Feeds `context` once for `specs` (each one can_share() accepts).
  SharedPrefill(const LlamaModel& model, const std::vector<int32_t>& context,
                const std::vector<ResolvedSpec>& specs);
  ~SharedPrefill();

  static bool can_share(const ResolvedSpec& spec, const LlamaModel& model);
  // can_share's part that needs no model: false for a method that always prefills its own
  // context (a sparse prefill, a store the context reads back, reuse); a policy that
  // propagates only some tokens is known once the model's shape is.
  static bool may_share(const ResolvedSpec& spec);

  // Whether the prefill ran for this canonical spec.
  bool serves(const std::string& canonical) const;
  // A cache for `canonical` (served) holding the context, its end not yet marked. *prefill_ms
  // is what a prefill of its own would have taken: the shared forward less all the time
  // spent observing (a plain forward), plus its own observing, with the scored attention
  // pass's extra cost for a scored method (the fork's own time is the caller's to measure).
  KvCache fork(const std::string& canonical, double* prefill_ms) const;

  int64_t context_tokens() const { return context_tokens_; }
  double forward_ms() const { return forward_ms_; }  // the shared forward, all observing

  // KVzip's reconstruction forwards (harness/reconstruction.h) depend on the cache's contents
  // and not on the budget, so the first fork that runs them over `span` (the context, or
  // query-aware the context and a request's query) keeps its scores here for the forks of
  // the same method at other budgets: a fork with dense stores, `span` fed, adopts them
  // (KvCache::adopt_scores) and *ms gets what the scoring took where it ran.
  bool adopt_reconstruction(const std::vector<int32_t>& span, KvCache& cache, double* ms) const;
  void keep_reconstruction(const std::vector<int32_t>& span, const KvCache& cache,
                           double ms) const;
  int64_t reconstructions_kept() const { return static_cast<int64_t>(reconstructions_.size()); }
  int64_t reconstructions_adopted() const { return reconstructions_adopted_; }

 private:
  struct Method;
  struct Reconstruction {
    std::vector<int32_t> span;
    std::unique_ptr<TokenPolicy> scored;  // a copy of the policy that observed the forwards
    int64_t peak = 0;                     // the cache's peak after them
    double ms = 0;
  };
  const LlamaModel& model_;
  int64_t context_tokens_ = 0;
  double forward_ms_ = 0;
  double base_ms_ = 0;  // the forward less the time spent observing: a plain forward
  std::unique_ptr<KvCache> full_;
  std::vector<Method> methods_;
  // Kept and adopted by the sample's units, which run one after the other.
  mutable std::vector<Reconstruction> reconstructions_;
  mutable int64_t reconstructions_adopted_ = 0;
};

}  // namespace kvbench
