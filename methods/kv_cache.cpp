#include "methods/kv_cache.h"

#include <algorithm>
#include <cassert>

#include "methods/policy.h"

namespace kvbench {

KvCache::KvCache(KvShape shape, std::vector<std::unique_ptr<LayerKv>> layers,
                 std::unique_ptr<TokenPolicy> policy)
    : shape_(shape), layers_(std::move(layers)), policy_(std::move(policy)) {
  assert(static_cast<int32_t>(layers_.size()) == shape_.n_layers);
  bytes_peak_ = bytes_resident();
}

KvCache::KvCache(KvCache&&) noexcept = default;
KvCache& KvCache::operator=(KvCache&&) noexcept = default;
KvCache::~KvCache() = default;

void KvCache::append(int32_t layer, const float* k, const float* v, const int32_t* positions,
                     int64_t n_new) {
  // No peak update here: layers only grow within a forward, so advance() sees the peak
  // before the policy evicts (and stats() counts what is resident now).
  layers_[layer]->append(k, v, positions, n_new);
}

void KvCache::attend(int32_t layer, const AttentionQuery& query) {
  layers_[layer]->attend(query);
  if (policy_) policy_->observe(layer, query, layers_[layer]->view());
}

void KvCache::advance(int32_t n_tokens) {
  next_position_ += n_tokens;
  bytes_peak_ = std::max(bytes_peak_, bytes_resident());
  compress(context_ended_ ? CachePhase::AfterContext : CachePhase::ContextChunk);
}

void KvCache::end_context() {
  context_ended_ = true;
  compress(CachePhase::ContextEnd);
}

void KvCache::compress(CachePhase phase) {
  if (!policy_) return;
  RetainPlan plan;
  for (int32_t l = 0; l < shape_.n_layers; ++l) {
    LayerKv& store = *layers_[l];
    if (!policy_->plan(l, store.view(), phase, plan)) continue;
    assert(static_cast<int64_t>(plan.slots.size()) == plan.n_keep * shape_.n_kv_heads);
    tokens_evicted_ += store.n_tokens() - plan.n_keep;
    store.retain(plan);
    policy_->retained(l, plan);
  }
}

void KvCache::reserve(int64_t n_tokens) {
  for (auto& layer : layers_) layer->reserve(n_tokens);
  bytes_peak_ = std::max(bytes_peak_, bytes_resident());
}

void KvCache::reserve_more(int64_t n_tokens) {
  for (auto& layer : layers_) layer->reserve(layer->n_tokens() + n_tokens);
  bytes_peak_ = std::max(bytes_peak_, bytes_resident());
}

KvCache KvCache::clone() const {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (const auto& layer : layers_) layers.push_back(layer->clone());
  KvCache copy(shape_, std::move(layers), policy_ ? policy_->clone() : nullptr);
  copy.next_position_ = next_position_;
  copy.context_ended_ = context_ended_;
  copy.bytes_peak_ = bytes_peak_;
  copy.tokens_evicted_ = tokens_evicted_;
  return copy;
}

int64_t KvCache::bytes_resident() const {
  int64_t total = 0;
  for (int32_t l = 0; l < shape_.n_layers; ++l) {
    total += layers_[l]->bytes_resident() + (policy_ ? policy_->bytes_resident(l) : 0);
  }
  return total;
}

CacheStats KvCache::stats() const {
  CacheStats stats;
  for (int32_t l = 0; l < shape_.n_layers; ++l) {
    const int64_t bytes =
        layers_[l]->bytes_resident() + (policy_ ? policy_->bytes_resident(l) : 0);
    stats.tokens_per_layer.push_back(layers_[l]->n_tokens());
    stats.bytes_per_layer.push_back(bytes);
    stats.bytes_resident += bytes;
  }
  stats.tiers.push_back(TierBytes{"ram", stats.bytes_resident});
  stats.bytes_peak = std::max(bytes_peak_, stats.bytes_resident);
  stats.tokens_seen = next_position_;
  stats.tokens_evicted = tokens_evicted_;
  return stats;
}

}  // namespace kvbench
