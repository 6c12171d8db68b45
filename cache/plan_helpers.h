// Steps every eviction policy repeats: when its budget applies, turning scores into a
// RetainPlan, and moving per-slot state along a plan. Shared by StreamingLLM, TOVA, Knorm,
// KeyDiff, H2O, SnapKV, ...
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <vector>

#include "cache/budget.h"
#include "cache/policy.h"

namespace kvbench {

// The token limit of each layer for one Budget. A token budget applies at every phase. A
// ratio is a fraction of the shared context, so it resolves from the layer's token count
// at the first ContextEnd and holds from then on (later ContextEnds do not shrink it
// again); before that no limit applies.
class LayerLimits {
 public:
  LayerLimits(const Budget& budget, int32_t n_layers);

  // The limit for `layer` at `phase` with `n_tokens` stored, or -1 while none applies (a
  // ratio before ContextEnd). Resolves a ratio at ContextEnd.
  int64_t resolve(int32_t layer, CachePhase phase, int64_t n_tokens);

  const Budget& budget() const { return budget_; }

 private:
  Budget budget_;
  std::vector<int64_t> resolved_;  // per layer, -1 until a ratio resolves
};

// KV head `head`'s slots ordered by position, oldest first, partially: the first `n_oldest`
// and the last `n_newest` entries are the oldest and newest tokens (each group in any
// order; the middle unordered). Where "the first" and "the most recent" tokens are, since
// applying a plan may reorder slots; O(n_tokens), no full sort on every decode step. The
// head's own tokens (kv.tokens(head)) in a view of heads that hold their own counts.
std::vector<int32_t> slots_by_position(const DenseKv& kv, int32_t head, int64_t n_oldest,
                                       int64_t n_newest);

// One slot list for every KV head (per-layer methods: StreamingLLM, TOVA).
// keep: ascending slots.
void plan_same_slots(const std::vector<int32_t>& keep, int32_t n_kv_heads, RetainPlan& plan);

// Per KV head, the k slots with the largest score (ties: the lower slot), ascending.
// scores: [n_kv_heads, n_tokens]. Requires 0 <= k <= n_tokens.
void plan_top_k_per_head(const float* scores, int32_t n_kv_heads, int64_t n_tokens, int64_t k,
                         RetainPlan& plan);

// The k slots with the largest score in one row, kept in every KV head (TOVA).
// scores: [n_tokens]. Requires 0 <= k <= n_tokens.
void plan_top_k_same(const float* scores, int64_t n_tokens, int64_t k, int32_t n_kv_heads,
                     RetainPlan& plan);

// Moves per-slot state along a plan the store has applied. state: [rows, n_old] with
// n_old the slot count before the plan; afterwards [rows, plan.n_keep]. Row r follows KV
// head r * n_kv_heads / rows, so rows may be n_kv_heads (state per KV head), n_heads (per
// query head: each GQA group follows its KV head) or 1 (one row per layer, for plans that
// keep the same slots in every head). Memory is given back once half the buffer is idle,
// so one drop per decode step does not reallocate every step (the state is small next to
// the KV it scores).
template <typename T>
void retain_rows(std::vector<T>& state, int64_t rows, int64_t n_old, const RetainPlan& plan,
                 int32_t n_kv_heads) {
  assert(static_cast<int64_t>(state.size()) == rows * n_old);
  assert(rows == 1 || rows % n_kv_heads == 0);
  const int64_t n_keep = plan.n_keep;
  // Rows compact front to back in place: row r's kept entries land at r * n_keep + j, never
  // after where they are read from (r * n_old + slot, with slot >= j and n_keep <= n_old).
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* keep = plan.slots.data() + (r * n_kv_heads / rows) * n_keep;
    for (int64_t j = 0; j < n_keep; ++j) state[r * n_keep + j] = state[r * n_old + keep[j]];
  }
  state.resize(static_cast<size_t>(rows * n_keep));
  if (state.size() * 2 <= state.capacity()) state.shrink_to_fit();
}

// Bytes a vector's buffer holds, for TokenPolicy::bytes_resident.
template <typename T>
int64_t vector_bytes(const std::vector<T>& v) {
  return static_cast<int64_t>(v.capacity() * sizeof(T));
}

// A vector whose copy holds a buffer as large as the original's. bytes_resident counts
// capacity, and a policy forked from the shared prefill's (harness/shared_prefill.h) is a
// copy: with this, it grows and counts its bytes as the policy of its own prefill would.
template <typename T>
class HeldVector : public std::vector<T> {
 public:
  HeldVector() = default;
  HeldVector(const HeldVector& other) : std::vector<T>() {
    this->reserve(other.capacity());
    this->assign(other.begin(), other.end());
  }
  HeldVector(HeldVector&&) noexcept = default;
  HeldVector& operator=(const HeldVector&) = default;
  HeldVector& operator=(HeldVector&&) noexcept = default;
};

// One slot selection shared by groups of `group` consecutive layers (ChunkKV's layer-wise
// index reuse, WindowKV's layer groups): a group's first layer selects, the others reuse its
// slots while they see the same context length and limit (a context never evicted before
// ContextEnd holds its slots in position order in every layer).
class LayerGroupSlots {
 public:
  // The slots `layer` keeps; select() makes them where the group's choice does not apply.
  template <typename Select>
  const std::vector<int32_t>& slots(int32_t layer, int64_t group, int64_t n_tokens,
                                    int64_t limit, Select&& select) {
    if (layer % group == 0 || n_tokens != n_tokens_ || limit != limit_) {
      slots_ = select();
      n_tokens_ = n_tokens;
      limit_ = limit;
    }
    return slots_;
  }
  int64_t bytes() const { return vector_bytes(slots_); }

 private:
  std::vector<int32_t> slots_;
  int64_t n_tokens_ = -1, limit_ = -1;  // what slots_ was selected for
};

// Throws std::invalid_argument "<store>::retain: ..." unless `plan` is one LayerKv::retain
// accepts for a store of n_tokens: n_keep of the stored slots per KV head, each head's
// ascending, merged rows (if any) head_dim values per kept slot. The device stores check
// it: a bad slot would make their gathers skip rows silently.
void check_retain_plan(const RetainPlan& plan, int32_t n_kv_heads, int32_t head_dim,
                       int64_t n_tokens, const std::string& store);

}  // namespace kvbench
