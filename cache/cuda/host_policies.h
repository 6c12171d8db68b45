// Cache methods for a model on a GPU whose decisions are still made on the host: a policy
// (eviction, merging) or read policy (Quest) wrapped so that it sees host copies of what it
// reads, while the KV, attention and the applied plans stay on the device.
//
// Each call copies down only what the wrapped method reads at that moment: the query rows
// of the forward (a few KiB) and, for a policy, the layer's stored tokens (an eviction
// method holds about its budget, so this stays small after the first compression; a
// once-only method such as SnapKV stops being called once it has compressed). The policies
// that score every forward by the attention each slot receives (H2O, TOVA:
// TokenPolicy::scored_rows) get it from attention_scores_cuda instead, [n_heads, n_tokens]
// floats, and the slots' positions to plan: no keys or values come down. Quest's page
// metadata stays on the host and its chosen pages go up to the device. The copies (and the
// device scores) are transient: freed before the call returns, not counted as resident.
// Host code; pulls in <cuda_runtime.h>.
#pragma once

#include <memory>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/policy.h"
#include "cache/read_policy.h"
#include "kernels/cuda/device_buffer.h"

namespace kvbench {

struct ResolvedSpec;

class HostPolicyOnDevice : public TokenPolicy {
 public:
  explicit HostPolicyOnDevice(std::unique_ptr<TokenPolicy> inner);
  std::unique_ptr<TokenPolicy> clone() const override;

  // query and kv: DEVICE pointers, copied to the host for the wrapped policy.
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override;
  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override;
  bool reads_context_end() const override { return inner_->reads_context_end(); }
  void context_ending(int32_t layer, const DenseKv& kv) override;  // kv: DEVICE, copied
  void retained(int32_t layer, const RetainPlan& plan) override { inner_->retained(layer, plan); }
  int64_t bytes_resident(int32_t layer) const override { return inner_->bytes_resident(layer); }
  int64_t context_block() const override { return inner_->context_block(); }
  bool done(int32_t layer) const override { return inner_->done(layer); }
  void context_text(const std::vector<std::string>& token_texts) override {
    inner_->context_text(token_texts);
  }
  bool scores_by_reconstruction() const override { return inner_->scores_by_reconstruction(); }
  void reconstructing(int64_t begin, int64_t end, int64_t n_context) override {
    inner_->reconstructing(begin, end, n_context);
  }

 private:
  std::unique_ptr<TokenPolicy> inner_;
};

class HostReaderOnDevice : public ReadPolicy {
 public:
  HostReaderOnDevice(std::unique_ptr<ReadPolicy> inner, int32_t n_kv_heads, int32_t head_dim);
  std::unique_ptr<ReadPolicy> clone() const override;

  // k: DEVICE [n_new, n_kv_heads, head_dim], copied to the host for the wrapped reader.
  void appended(int32_t layer, const float* k, int64_t first_slot, int64_t n_new) override;
  // query: DEVICE pointers. The selection's pages are a DEVICE array, valid until the next
  // call (as the store's attend expects on the device).
  const PageSelection* select(int32_t layer, const AttentionQuery& query, int64_t n_tokens,
                              int64_t* bytes_read) override;
  int64_t bytes_resident(int32_t layer) const override { return inner_->bytes_resident(layer); }
  void context_ended() override { inner_->context_ended(); }
  Recall recall() const override { return inner_->recall(); }

 private:
  std::unique_ptr<ReadPolicy> inner_;
  int32_t n_kv_heads_;
  int32_t head_dim_;
  DeviceBuffer<int32_t> pages_;  // the last selection's pages on the device
  PageSelection selection_{};
};

}  // namespace kvbench
