#include "cache/kv_cache.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <vector>

#include "cache/policy.h"
#include "cache/prefill_attention.h"

namespace kvbench {

KvCache::KvCache(KvShape shape, std::vector<std::unique_ptr<LayerKv>> layers,
                 std::unique_ptr<TokenPolicy> policy, std::unique_ptr<ReadPolicy> reader)
    : shape_(shape),
      layers_(std::move(layers)),
      policy_(std::move(policy)),
      reader_(std::move(reader)) {
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
  if (tap_) tap_->appended(layer, k, v, positions, n_new);
  const int64_t first_slot = layers_[layer]->n_tokens();
  layers_[layer]->append(k, v, positions, n_new);
  if (reader_) reader_->appended(layer, k, first_slot, n_new);
}

void KvCache::attend(int32_t layer, const AttentionQuery& query) {
  LayerKv& store = *layers_[layer];
  if (prefill_ && !decode_step_ && (!context_ended_ || prefill_->sparse_after_context())) {
    // A sparse prefill reads the store's fp32 view (every row of it, some query reads each).
    const DenseKv kv = store.view();
    const AttentionPairs pairs = prefill_->attend(query, kv, forward_end_);
    attn_flops_ += 4.0 * kv.head_dim * static_cast<double>(pairs.computed);
    attn_flops_dense_ += 4.0 * kv.head_dim * static_cast<double>(pairs.dense);
    bytes_read_forward_ += kv.n_kv_heads * kv.n_tokens *
                           static_cast<int64_t>(2 * kv.head_dim * sizeof(float) + sizeof(int32_t));
  } else {
    const PageSelection* pages =
        reader_ && decode_step_
            ? reader_->select(layer, query, store.n_tokens(), &bytes_read_forward_)
            : nullptr;
    if (!pages && attend_scored(layer, query)) return;
    bytes_read_forward_ += store.attend(query, pages);
  }
  store.observe_queries(query);
  if (policy_ && !policy_->done(layer)) policy_->observe(layer, query, policy_view(store));
}

bool KvCache::attend_scored(int32_t layer, const AttentionQuery& query) {
  if (!policy_ || policy_->done(layer) ||
      policy_->scored_rows() != TokenPolicy::ScoredRows::All) {
    return false;
  }
  LayerKv& store = *layers_[layer];
  const int64_t n_tokens = store.n_tokens();
  static thread_local std::vector<float> scores;
  scores.assign(static_cast<size_t>(query.n_heads) * n_tokens, 0.0f);
  const int64_t bytes = store.attend_scored(query, scores.data());
  if (bytes < 0) return false;
  bytes_read_forward_ += bytes;
  store.observe_queries(query);
  policy_->observe_scores(layer, scores.data(), query.n_heads, n_tokens);
  return true;
}

void KvCache::advance(int32_t n_tokens) {
  next_position_ += n_tokens;
  decode_step_ = false;
  bytes_peak_ = std::max(bytes_peak_, bytes_resident());
  bytes_read_last_ = bytes_read_forward_;
  bytes_read_total_ += bytes_read_forward_;
  bytes_read_forward_ = 0;
  compress(context_ended_ ? CachePhase::AfterContext : CachePhase::ContextChunk);
}

void KvCache::end_context() {
  context_ended_ = true;
  if (policy_ && policy_->reads_context_end()) {
    for (int32_t l = 0; l < shape_.n_layers; ++l) {
      if (!policy_->done(l)) policy_->context_ending(l, policy_view(*layers_[l]));
    }
  }
  compress(CachePhase::ContextEnd);
  if (reader_) reader_->context_ended();
}

namespace {
// Tokens a store holds per KV head: their mean where heads hold their own counts.
int64_t held_per_head(const LayerKv& store, int32_t heads) {
  if (!store.holds_ragged_heads()) return store.n_tokens_held();
  int64_t sum = 0;
  for (int32_t h = 0; h < heads; ++h) sum += store.head_tokens(h);
  return heads > 0 ? (sum + heads - 1) / heads : 0;
}
}  // namespace

DenseKv KvCache::policy_view(const LayerKv& store) const {
  return policy_->reads_ragged_heads() ? store.heads_view() : store.view();
}

void KvCache::compress(CachePhase phase) {
  RetainPlan plan;
  for (int32_t l = 0; l < shape_.n_layers; ++l) {
    LayerKv& store = *layers_[l];
    // A dense prefill is never planned before its end: only a streamed one (context_block)
    // evicts chunk by chunk.
    const bool planning = policy_ && !policy_->done(l) &&
                          (phase != CachePhase::ContextChunk || policy_->context_block() > 0);
    plan.head_keep.clear();
    if (planning && policy_->plan(l, policy_view(store), phase, plan)) {
      if (plan.ragged() && !store.holds_ragged_heads()) {
        throw std::invalid_argument("a ragged retain plan for a store that holds equal heads");
      }
      assert(static_cast<int64_t>(plan.slots.size()) == plan.head_offset(shape_.n_kv_heads));
      const int64_t held = held_per_head(store, shape_.n_kv_heads);
      store.retain(plan);
      tokens_evicted_ += held - held_per_head(store, shape_.n_kv_heads);
      policy_->retained(l, plan);
    }
    if (phase != CachePhase::ContextChunk || settle_chunks_) store.settle();
  }
}

bool KvCache::settle_context_chunks() {
  assert(next_position_ == 0);
  if (policy_) return false;
  // Every layer holds the same kind of store: the first answers for all.
  settle_chunks_ = std::all_of(layers_.begin(), layers_.end(),
                               [](const auto& l) { return l->settle_each_chunk(); });
  assert(settle_chunks_ || !layers_.front()->settle_each_chunk());
  return settle_chunks_;
}

void KvCache::reserve(int64_t n_tokens) {
  for (auto& layer : layers_) layer->reserve(n_tokens);
  bytes_peak_ = std::max(bytes_peak_, bytes_resident());
}

void KvCache::reserve_more(int64_t n_tokens) {
  for (auto& layer : layers_) layer->reserve(layer->n_tokens() + n_tokens);
  bytes_peak_ = std::max(bytes_peak_, bytes_resident());
}

void KvCache::reserve_more(int64_t n_tokens, int32_t first, int32_t end) {
  for (int32_t l = first; l < end; ++l) layers_[l]->reserve(layers_[l]->n_tokens() + n_tokens);
  bytes_peak_ = std::max(bytes_peak_, bytes_resident());
}

KvCache KvCache::scoring_copy(int64_t begin, int64_t end) const {
  assert(policy_ && policy_->scores_by_reconstruction() && !context_ended_);
  KvCache copy = clone();
  copy.policy_->reconstructing(begin, end, next_position_);
  return copy;
}

bool KvCache::adopt_scores(const TokenPolicy& scored, int64_t scored_peak) {
  assert(!context_ended_);
  if (!policy_ || !policy_->adopt_scores(scored)) return false;
  bytes_peak_ = std::max(bytes_peak_, scored_peak);
  return true;
}

void KvCache::adopt_scoring(KvCache&& scratch) {
  policy_ = std::move(scratch.policy_);
  bytes_peak_ = std::max(bytes_peak_, scratch.bytes_peak_);
}

KvCache KvCache::clone() const {
  std::vector<std::unique_ptr<LayerKv>> layers;
  for (const auto& layer : layers_) layers.push_back(layer->clone());
  KvCache copy(shape_, std::move(layers), policy_ ? policy_->clone() : nullptr,
               reader_ ? reader_->clone() : nullptr);
  copy.next_position_ = next_position_;
  copy.context_ended_ = context_ended_;
  copy.settle_chunks_ = settle_chunks_;
  copy.bytes_peak_ = bytes_peak_;
  copy.tokens_evicted_ = tokens_evicted_;
  copy.bytes_read_forward_ = bytes_read_forward_;
  copy.bytes_read_last_ = bytes_read_last_;
  copy.bytes_read_total_ = bytes_read_total_;
  copy.prefill_ = prefill_;
  copy.forward_end_ = forward_end_;
  copy.attn_flops_ = attn_flops_;
  copy.attn_flops_dense_ = attn_flops_dense_;
  return copy;
}

void KvCache::load_prefill(const KvCache& source, int64_t chunk, const TokenPolicy* observed) {
  assert(next_position_ == 0 && !source.context_ended_ && chunk > 0);
  const int64_t n = source.next_position_;
  const int64_t d = shape_.head_dim, heads = shape_.n_kv_heads;
  reserve_more(n);
  std::vector<float> k, v;
  std::vector<int32_t> positions;
  for (int32_t l = 0; l < shape_.n_layers; ++l) {
    const DenseKv kv = source.layer(l).view();
    assert(kv.n_tokens == n);
    for (int64_t first = 0; first < n; first += chunk) {
      const int64_t rows = std::min(chunk, n - first);
      k.resize(static_cast<size_t>(rows * heads * d));
      v.resize(k.size());
      positions.assign(kv.positions + first, kv.positions + first + rows);
      for (int64_t t = 0; t < rows; ++t) {  // [heads, capacity, d] -> [rows, heads, d]
        for (int32_t h = 0; h < heads; ++h) {
          const float* from_k = kv.k + (h * kv.capacity + first + t) * d;
          const float* from_v = kv.v + (h * kv.capacity + first + t) * d;
          std::copy(from_k, from_k + d, k.begin() + (t * heads + h) * d);
          std::copy(from_v, from_v + d, v.begin() + (t * heads + h) * d);
        }
      }
      append(l, k.data(), v.data(), positions.data(), rows);
    }
  }
  next_position_ = source.next_position_;
  bytes_read_last_ = source.bytes_read_last_;
  bytes_read_total_ = source.bytes_read_total_;
  int64_t at_end = bytes_resident();
  for (int32_t l = 0; l < shape_.n_layers && observed && policy_; ++l) {
    at_end += observed->bytes_resident(l) - policy_->bytes_resident(l);
  }
  bytes_peak_ = std::max(bytes_peak_, at_end);
}

int64_t KvCache::bytes_resident() const {
  int64_t total = 0;
  for (int32_t l = 0; l < shape_.n_layers; ++l) {
    total += layer_bytes(l);
  }
  return total;
}

int64_t KvCache::layer_bytes(int32_t layer) const {
  return layers_[layer]->bytes_resident() + (policy_ ? policy_->bytes_resident(layer) : 0) +
         (reader_ ? reader_->bytes_resident(layer) : 0);
}

CacheStats KvCache::stats() const {
  CacheStats stats;
  for (int32_t l = 0; l < shape_.n_layers; ++l) {
    const int64_t bytes = layer_bytes(l);
    for (int32_t h = 0; h < shape_.n_kv_heads; ++h) {
      stats.tokens_per_head.push_back(layers_[l]->head_tokens(h));
    }
    stats.tokens_per_layer.push_back(held_per_head(*layers_[l], shape_.n_kv_heads));
    stats.bytes_per_layer.push_back(bytes);
    stats.bytes_resident += bytes;
  }
  // Each store's bytes in its tier; policy state and read metadata live on the host.
  const auto add = [&](const std::string& tier, int64_t bytes) {
    auto it = std::find_if(stats.tiers.begin(), stats.tiers.end(),
                           [&](const TierBytes& t) { return t.tier == tier; });
    if (it == stats.tiers.end()) it = stats.tiers.insert(stats.tiers.end(), TierBytes{tier, 0});
    it->bytes += bytes;
  };
  for (int32_t l = 0; l < shape_.n_layers; ++l) {
    const int64_t store = layers_[l]->bytes_resident();
    add(layers_[l]->tier(), store);
    if (stats.bytes_per_layer[l] > store) add("ram", stats.bytes_per_layer[l] - store);
  }
  stats.bytes_peak = std::max(bytes_peak_, stats.bytes_resident);
  stats.tokens_seen = next_position_;
  stats.tokens_evicted = tokens_evicted_;
  stats.bytes_read_last_forward = bytes_read_last_;
  stats.bytes_read_total = bytes_read_total_;
  return stats;
}

}  // namespace kvbench
