// The skeleton of a method that compresses each layer once, at the end of the shared context,
// from the context's last `window` queries (SnapKV's observation window): SnapKV and
// PyramidKV, CriticalKV, CAOTE, CaM, ChunkKV, CompressKV, GraphKV, KVMerger, SimLayerKV,
// UNComp, WindowKV and the scorer form (cache/scorer_method.h) differ only in what they
// make of the window. It holds each layer's window while the context comes in, resolves the
// layer's budget at ContextEnd and hands both to select(); the layer is then done, and later
// tokens are appended whole.
#pragma once

#include <cstdint>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/policy.h"
#include "cache/query_window.h"

namespace kvbench {

class WindowedPolicy : public TokenPolicy {
 public:
  // window: the context queries held per layer (0: none; the scorer form without a window).
  WindowedPolicy(const Budget& budget, int64_t window, int32_t n_layers)
      : limits_(budget, n_layers), window_(window), windows_(n_layers, window) {}

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    windows_.observe(layer, query, kv.head_dim);
  }
  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) final;
  int64_t bytes_resident(int32_t layer) const override { return windows_.bytes_resident(layer); }
  bool done(int32_t layer) const override { return windows_.closed(layer); }

 protected:
  // Plans `layer`'s n = kv.n_tokens context slots to keep at most `limit` (< n: the layer's
  // budget, layer_limit's) of them: fills `plan` and returns true, or returns false to keep
  // the layer whole. A context is never evicted before its end, so the slots are in position
  // order and the window's own tokens are the last ones. `held`: the layer's window (gone
  // once this returns).
  virtual bool select(int32_t layer, const DenseKv& kv, const QueryWindow& held, int64_t limit,
                      RetainPlan& plan) = 0;
  // The layer's limit from the budget's (`budget_limit`, the same for every layer): WindowKV
  // moves budget between layer groups. At most n_tokens keeps the layer whole.
  virtual int64_t layer_limit(int32_t /*layer*/, int64_t /*n_tokens*/,
                              int64_t budget_limit) const {
    return budget_limit;
  }
  int64_t window() const { return window_; }  // as configured (select's limit may be less)
  bool closed(int32_t layer) const { return windows_.closed(layer); }

 private:
  LayerLimits limits_;
  int64_t window_;
  ContextWindows windows_;
};

}  // namespace kvbench
