// The full dense cache: every token's keys and values in fp32, per KV head. The
// reference every other method is compared with, and the store eviction policies drop
// slots from.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cache/head_rows.h"
#include "cache/kv_cache.h"
#include "cache/ragged_view.h"

namespace kvbench {

// Room an evicting store grows by for the tokens of the next steps. A drop that leaves
// more than twice this idle (or more idle than kept) cuts the buffer to what is kept, so
// bytes resident follow the tokens kept without reallocating at every decode step.
constexpr int64_t kEvictionSlack = 64;

// The capacity a store holding `capacity` rows per head moves to when `need` (> capacity)
// no longer fits: a growing cache grows geometrically, so token-by-token decode does not
// copy it every step; one that has evicted holds about its budget, so it grows by the slack.
inline int64_t grown_capacity(int64_t capacity, int64_t need, bool evicted) {
  return evicted ? need + kEvictionSlack : std::max(need, capacity + capacity / 2 + 64);
}

// Whether a store of `capacity` rows per head that keeps n_keep after a retain cuts its
// buffers to n_keep: a compression gives its memory back at once; a decode-step eviction
// (one token out for the one that came in) reuses the slot instead of reallocating.
inline bool retain_shrinks(int64_t capacity, int64_t n_keep) {
  const int64_t idle = capacity - n_keep;
  return idle > 2 * kEvictionSlack || idle > n_keep;
}

class DenseLayerKv : public LayerKv {
 public:
  DenseLayerKv(int32_t n_kv_heads, int32_t head_dim);

  void reserve(int64_t n_tokens) override;
  void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) override;
  int64_t attend(const AttentionQuery& query, const PageSelection* pages) const override;
  int64_t attend_scored(const AttentionQuery& query, float* scores) const override;
  void retain(RetainPlan& plan) override;
  // Once the heads hold different counts no rectangle shows them: the view is the shape
  // alone (k, v and positions null, n_tokens the largest head's), as a device store shows a
  // host policy. A policy that plans ragged and plans again later (DuoAttention's streaming
  // heads) follows its slots itself, by the placement retain hands back in the plan.
  DenseKv view() const override;
  DenseKv heads_view() const override;  // ragged: the heads gathered
  void settle() override { ragged_view_.clear(); }
  std::unique_ptr<LayerKv> clone() const override;
  int64_t n_tokens() const override;  // ragged: the largest head's
  int64_t head_tokens(int32_t head) const override;
  bool holds_ragged_heads() const override { return true; }
  int64_t bytes_resident() const override;

  int64_t capacity() const { return rows_.capacity; }
  bool ragged() const { return !heads_.empty(); }
  // KV head `head` alone (n_kv_heads 1), ragged or not: what it holds, for tests and tools.
  DenseKv head_view(int32_t head) const;

 private:
  void split_heads(RetainPlan& plan);  // the first ragged plan: one buffer per KV head

  HeadRows rows_;                // every KV head, equal counts (until a ragged plan)
  std::vector<HeadRows> heads_;  // after one: KV head h alone in heads_[h], sized to its count
  bool evicted_ = false;         // a plan has dropped slots: growth is by kEvictionSlack
  mutable RaggedView ragged_view_;  // heads_view's copy, until settle()
};

// Where a retain plan puts one head's kept slots. keep: the kept slots, ascending; on
// return keep[j] is the old slot placed at new slot j (always >= j). Kept slots below
// `settled` stay where they are, the holes there take the oldest kept slots at or past it,
// and the rest follow in order. settled = n_keep fills every hole from the end (one
// decode-step eviction moves one token); the KIVI store settles its packed blocks only,
// so its fp32 tail keeps the newest tokens in position order.
void place_kept_slots(int32_t* keep, int64_t n_keep, int64_t settled);

// place_kept_slots for every head of `plan` (plan.slots ascending, as planned), as indices
// into the head's plan row: the slot placed at new slot j of head h is
// plan.slots[h * n_keep + order[h * n_keep + j]]. The device stores place a plan's slots and
// its merged rows by it, as the host stores do.
std::vector<int32_t> kept_slot_order(const RetainPlan& plan, int32_t n_kv_heads, int64_t settled);

// Applies `plan` in place to KV rows held as [n_kv_heads, capacity, head_dim] with
// positions [n_kv_heads, capacity], as LayerKv::retain describes: merged contents first,
// then the kept slots are placed (place_kept_slots; settled < 0: n_keep) and plan.slots
// becomes that placement. The dense and KIVI stores share it.
void retain_rows_in_place(float* k, float* v, int32_t* positions, int32_t n_kv_heads,
                          int32_t head_dim, int64_t capacity, int64_t n_tokens, RetainPlan& plan,
                          int64_t settled = -1);

// Slots a page selection covers, summed over KV heads, in a store of n_tokens.
int64_t selected_slots(const PageSelection& pages, int32_t n_kv_heads, int64_t n_tokens);

// A dense store per layer, empty.
std::vector<std::unique_ptr<LayerKv>> make_dense_layers(const KvShape& shape);

// Dense stores for every layer and no policy: the plain model path.
KvCache make_full_cache(const KvShape& shape);

}  // namespace kvbench
