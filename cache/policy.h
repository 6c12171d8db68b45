// Stage 2 of a cache method (docs/methods.md, "Adding a cache method"): the policy that decides
// which tokens each layer keeps. It scores and plans; the layer's store (LayerKv::retain) applies
// the plan and frees the memory. A policy never touches storage itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/layouts.h"

namespace kvbench {

// Which stored slots a layer keeps: for KV head h, slots[h * n_keep + j], ascending in j.
// Per-layer methods (TOVA, StreamingLLM) repeat one list for every head. Applying a plan
// may reorder slots (LayerKv::retain), so a policy finds "recent" or "first" tokens by
// their positions, never by slot order.
struct RetainPlan {
  int64_t n_keep = 0;
  std::vector<int32_t> slots;  // [n_kv_heads, n_keep]
  // Empty, or new contents for the kept slots (merging methods: a kept token absorbs those
  // dropped beside it): k[(h * n_keep + j) * head_dim] replaces the key of slot
  // slots[h * n_keep + j] as planned (before the store moves it), v likewise.
  std::vector<float> k, v;  // [n_kv_heads, n_keep, head_dim]
  // Empty: every KV head keeps n_keep slots. Otherwise KV head h keeps head_keep[h] slots
  // (head-wise budgets: cache/allocation.h), listed ascending from slots[head_offset(h)],
  // and n_keep is the largest of them. Only a store whose heads hold their own counts
  // (LayerKv::holds_ragged_heads) applies such a plan; it carries no merged rows.
  std::vector<int64_t> head_keep;  // [n_kv_heads]

  bool ragged() const { return !head_keep.empty(); }
  int64_t kept(int32_t head) const { return ragged() ? head_keep[head] : n_keep; }
  int64_t head_offset(int32_t head) const {
    if (!ragged()) return static_cast<int64_t>(head) * n_keep;
    int64_t offset = 0;
    for (int32_t h = 0; h < head; ++h) offset += head_keep[h];
    return offset;
  }
};

// KV head `head`'s row of `plan` as a plan for a store holding that head alone (its slots,
// and its merged rows where the plan merges): how a layer whose heads are stores of their
// own applies a plan, head by head.
inline RetainPlan one_head_plan(const RetainPlan& plan, int32_t head, int32_t head_dim) {
  RetainPlan one;
  one.n_keep = plan.kept(head);
  const auto first = static_cast<ptrdiff_t>(plan.head_offset(head));
  one.slots.assign(plan.slots.begin() + first, plan.slots.begin() + first + one.n_keep);
  if (!plan.k.empty()) {
    const ptrdiff_t row = first * head_dim, n = one.n_keep * head_dim;
    one.k.assign(plan.k.begin() + row, plan.k.begin() + row + n);
    one.v.assign(plan.v.begin() + row, plan.v.begin() + row + n);
  }
  return one;
}

// Applies `plan` head by head: apply(h, one) with KV head h's one_head_plan, after which
// one.slots is that head's placement; plan.slots becomes the heads' placements in order.
template <class ApplyToHead>
void retain_head_by_head(RetainPlan& plan, int32_t n_kv_heads, int32_t head_dim,
                         const ApplyToHead& apply) {
  std::vector<int32_t> placed;
  placed.reserve(plan.slots.size());
  for (int32_t h = 0; h < n_kv_heads; ++h) {
    RetainPlan one = one_head_plan(plan, h, head_dim);
    apply(h, one);
    placed.insert(placed.end(), one.slots.begin(), one.slots.end());
  }
  plan.slots = std::move(placed);
}

// Rows a model forward feeds at most at once (LlamaModel::prefill_chunk): longer inputs
// go in chunks of this many, the cache advancing after each.
constexpr int64_t kPrefillChunk = 512;

// When KvCache asks the policy to plan.
enum class CachePhase : int32_t {
  ContextChunk,  // after a chunk of a streamed prefill of the shared context
  ContextEnd,    // the whole shared context is in (SnapKV, Knorm, ... compress here)
  AfterContext,  // after any later forward: a query, an appended answer, a decode step
};

class TokenPolicy {
 public:
  virtual ~TokenPolicy() = default;
  virtual std::unique_ptr<TokenPolicy> clone() const = 0;

  // Called right after `layer`'s queries attended over `kv` (which includes their own
  // tokens): where attention-based scores (H2O, TOVA, SnapKV's window) are gathered.
  virtual void observe(int32_t /*layer*/, const AttentionQuery& /*query*/,
                       const DenseKv& /*kv*/) {}

  // A policy whose observe needs only the softmax attention the slots receive says from
  // which query rows here, and is then handed it by observe_scores instead of observe where
  // it can be had cheaper: on the CPU, every row's (All) from the attention pass itself
  // (KvCache::attend_scored), where the store can; where the stored tokens are not in host
  // memory (a model on a GPU: cache/cuda/host_policies.h), computed on the device, and plan
  // then sees the slots' positions only (k and v null) unless plans_on_kv. observe and
  // observe_scores must agree: observe_scores gets what attention_scores_cpu adds up over
  // those rows, [n_heads, n_tokens].
  enum class ScoredRows { None, All, Last };
  virtual ScoredRows scored_rows() const { return ScoredRows::None; }
  virtual void observe_scores(int32_t /*layer*/, const float* /*scores*/, int32_t /*n_heads*/,
                              int64_t /*n_tokens*/) {}
  // A policy scored by rows (scored_rows) that still reads keys or values to plan (D2O
  // merges evicted tokens into kept ones).
  virtual bool plans_on_kv() const { return scored_rows() == ScoredRows::None; }

  // Plans `layer` at `phase`: fills `plan` and returns true to drop slots, or returns
  // false to keep everything.
  virtual bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) = 0;

  // The store applied `plan` to `layer`, which now says where each slot went (new slot j
  // holds old slot plan.slots[h * n_keep + j]): per-slot state (scores) must follow.
  virtual void retained(int32_t /*layer*/, const RetainPlan& /*plan*/) {}

  // Bytes of per-token state held for `layer` (scores), counted in the layer's KV bytes.
  virtual int64_t bytes_resident(int32_t /*layer*/) const { return 0; }

  // The chunk the shared context is fed in under a streamed prefill (prefill=stream), each
  // followed by a ContextChunk plan; 0: a dense prefill, never planned before ContextEnd
  // (cache/prefill_mode.h). At most kPrefillChunk, the rows a model forward feeds.
  virtual int64_t context_block() const { return 0; }

  // Query-agnostic scoring by reconstruction (KVzip): true when the policy ranks the context
  // by the attention of a forward that asks the model to repeat it. Before end_context the
  // session feeds that prompt, one span of the context at a time, through a copy of the
  // cache whose policy was first told the span (harness/reconstruction.h); the copy's
  // policy, having observed it, then replaces this one (KvCache::adopt_scoring). The span is
  // context positions [begin, end); the prompt's queries sit at positions >= n_context.
  virtual bool scores_by_reconstruction() const { return false; }
  virtual void reconstructing(int64_t /*begin*/, int64_t /*end*/, int64_t /*n_context*/) {}
  // Takes the reconstruction's scores another policy computed over the same cache contents
  // and the same forwards (`scored`: a copy of that policy once it observed them; its budget
  // may differ), and returns true, when they are exactly what this policy's own observing
  // would hold; false leaves it as it was. The sweep's methods that differ only in budget
  // then run the reconstruction once per context (harness/shared_prefill.h).
  virtual bool adopt_scores(const TokenPolicy& /*scored*/) { return false; }

  // Token-selective propagation (FastKV): the layer after which only the context tokens this
  // policy selects go on through the model while the context is prefilled
  // (LlamaModel::forward_propagating: the later layers store only those tokens), or -1:
  // every token goes through every layer.
  virtual int32_t propagation_layer() const { return -1; }
  // Those tokens, asked once `layer` (propagation_layer()) holds the whole context in `kv`,
  // nothing evicted, slots in position order: ascending slots, the last one among them.
  virtual std::vector<int64_t> propagated_rows(int32_t /*layer*/, const DenseKv& kv) const {
    std::vector<int64_t> rows(kv.n_tokens);
    for (int64_t i = 0; i < kv.n_tokens; ++i) rows[i] = i;
    return rows;
  }

  // The shared context's tokens as text (token_texts[i]: the decoded bytes of the token at
  // context position i), told before end_context to a policy that cuts the context into
  // segments it keeps or drops whole (ShotKV's shots); most policies ignore it.
  virtual void context_text(const std::vector<std::string>& /*token_texts*/) {}

  // A policy that splits the budget across layers from every layer's final state (CAKE's
  // preferences) asks, by reads_context_end, to see each layer's KV once the whole shared
  // context is in: context_ending is then called for every layer not done, in order, before
  // any layer's ContextEnd plan. Cheaper than recomputing that state at every forward of
  // the context, when only the last one counts.
  virtual bool reads_context_end() const { return false; }
  virtual void context_ending(int32_t /*layer*/, const DenseKv& /*kv*/) {}

  // True once `layer` is compressed for good (a policy that compresses once): observe and
  // plan are no longer called for it, so a packed store is not unpacked to show them.
  virtual bool done(int32_t /*layer*/) const { return false; }

  // A policy that goes on observing and planning a layer after a ragged plan (its own under
  // an allocation method, adakv+<name>), reading keys, values or positions: the cache then
  // shows it such a layer's heads gathered (LayerKv::heads_view: DenseKv::head_tokens gives
  // each head's count) instead of the shape alone, at the price of a copy of the layer each
  // time. Its later plans are ragged too (a head keeps at most what it holds).
  virtual bool reads_ragged_heads() const { return false; }
};

}  // namespace kvbench
