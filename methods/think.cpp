// ThinK's store (methods/think.h has the rule).
//
// Authors' settings (SalesforceAIResearch/ThinK ThinK_flash/src/kv_pruning_utils.py
// key_pruner_query_driven and init_snapkv; kvpress presses/think_press.py ThinKPress):
// - score per channel: mean of q^2 over the last 32 queries times mean of k^2 over the keys
//   (both codes); kvpress averages q^2 over the query heads of a GQA group too;
// - pruned: int(head_dim * ratio) lowest, ratio 0.4 in the authors' code (kvpress's
//   key_channel_compression_ratio defaults to 0, which prunes nothing); window 32;
// - the authors keep the newest recent_size (32) context keys whole and append later keys
//   whole ("will not update in inference mode"); kvpress zeroes every context key's pruned
//   channels and leaves later keys whole.
// Here: every key held once the context has ended is pruned, the context's newest and
// later tokens too (the same kept channels), so memory is saved on everything; the window
// queries are those the store saw (the last `window` rows the context's forwards fed);
// channel ties are pruned lowest index first.
#include "methods/think.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <numeric>
#include <string>

#include "cache/full_cache.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "kernels/cpu/attention.h"

namespace kvbench {

ThinkLayerKv::ThinkLayerKv(int32_t n_kv_heads, int32_t head_dim, const ThinkConfig& config)
    : n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      n_kept_(std::max(1, head_dim - static_cast<int32_t>(head_dim * config.channels))),
      window_(config.window),
      rows_(n_kv_heads, head_dim) {}

void ThinkLayerKv::reallocate(int64_t new_capacity) {
  assert(new_capacity >= n_tokens_);
  const int64_t kept = n_kept_, d = head_dim_;
  std::vector<float> keys(static_cast<size_t>(n_kv_heads_ * new_capacity * kept));
  std::vector<float> values(static_cast<size_t>(n_kv_heads_ * new_capacity * d));
  std::vector<int32_t> positions(static_cast<size_t>(n_kv_heads_ * new_capacity));
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    std::copy_n(keys_.data() + h * capacity_ * kept, n_tokens_ * kept,
                keys.data() + h * new_capacity * kept);
    std::copy_n(values_.data() + h * capacity_ * d, n_tokens_ * d,
                values.data() + h * new_capacity * d);
    std::copy_n(positions_.data() + h * capacity_, n_tokens_, positions.data() + h * new_capacity);
  }
  keys_.swap(keys);
  values_.swap(values);
  positions_.swap(positions);
  capacity_ = new_capacity;
}

void ThinkLayerKv::reserve(int64_t n_tokens) {
  if (!pruned_ && n_tokens > rows_.capacity) rows_.reallocate(n_tokens);
  if (pruned_ && n_tokens > capacity_) reallocate(n_tokens);
}

void ThinkLayerKv::append(const float* k, const float* v, const int32_t* positions, int64_t n_new) {
  std::vector<float>().swap(view_k_);
  if (!pruned_) {
    const int64_t need = rows_.n_tokens + n_new;
    if (need > rows_.capacity) rows_.reallocate(grown_capacity(rows_.capacity, need, evicted_));
    rows_.append(k, v, positions, n_new);
    return;
  }
  const int64_t need = n_tokens_ + n_new, kept = n_kept_, d = head_dim_;
  if (need > capacity_) reallocate(grown_capacity(capacity_, need, evicted_));
  for (int64_t t = 0; t < n_new; ++t) {
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const float* key = k + (t * n_kv_heads_ + h) * d;
      const int64_t slot = h * capacity_ + n_tokens_ + t;
      const int32_t* channels = &channels_[h * kept];
      for (int64_t j = 0; j < kept; ++j) keys_[slot * kept + j] = key[channels[j]];
      std::copy_n(v + (t * n_kv_heads_ + h) * d, d, &values_[slot * d]);
      positions_[slot] = positions[t];
    }
  }
  n_tokens_ = need;
}

void ThinkLayerKv::observe_queries(const AttentionQuery& query) {
  if (pruned_ || query.n_queries == 0) return;
  const int64_t row = static_cast<int64_t>(query.n_heads) * head_dim_;
  if (n_heads_ != query.n_heads) {  // the first forward: room for the whole window, once
    n_heads_ = query.n_heads;
    window_q_.clear();
    window_q_.reserve(static_cast<size_t>(window_ * row));
    window_rows_ = 0;
  }
  const int64_t take = std::min<int64_t>(query.n_queries, window_);
  const int64_t drop = std::max<int64_t>(0, window_rows_ + take - window_);
  window_q_.erase(window_q_.begin(), window_q_.begin() + drop * row);
  const float* newest = query.q + (query.n_queries - take) * row;
  window_q_.insert(window_q_.end(), newest, newest + take * row);
  window_rows_ += take - drop;
}

void ThinkLayerKv::prune() {
  const int64_t n = rows_.n_tokens, d = head_dim_, kept = n_kept_;
  const int32_t group = n_heads_ > 0 ? std::max(1, n_heads_ / n_kv_heads_) : 1;
  channels_.assign(static_cast<size_t>(n_kv_heads_ * kept), 0);
  std::vector<double> q2(static_cast<size_t>(d)), k2(q2.size()), score(q2.size());
  std::vector<int32_t> order(static_cast<size_t>(d));
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    // Mean q_c^2 over the window and the group's query heads; without queries (none seen),
    // the keys alone rank the channels.
    std::fill(q2.begin(), q2.end(), window_rows_ > 0 ? 0.0 : 1.0);
    for (int64_t r = 0; r < window_rows_; ++r) {
      for (int32_t g = 0; g < group; ++g) {
        const float* q = &window_q_[(r * n_heads_ + h * group + g) * d];
        for (int64_t c = 0; c < d; ++c) q2[c] += static_cast<double>(q[c]) * q[c];
      }
    }
    std::fill(k2.begin(), k2.end(), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const float* k = &rows_.k[(h * rows_.capacity + t) * d];
      for (int64_t c = 0; c < d; ++c) k2[c] += static_cast<double>(k[c]) * k[c];
    }
    const double q_count = std::max<int64_t>(1, window_rows_ * group);
    const double k_count = std::max<int64_t>(1, n);
    for (int64_t c = 0; c < d; ++c) score[c] = (q2[c] / q_count) * (k2[c] / k_count);
    // The d - kept lowest are pruned (ties: the lower channel first); the rest kept ascending.
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return score[a] < score[b]; });
    std::sort(order.begin() + (d - kept), order.end());
    std::copy(order.begin() + (d - kept), order.end(), &channels_[h * kept]);
  }
  // The held rows keep their slots, each key cut to its head's channels.
  capacity_ = 0;
  n_tokens_ = 0;
  reallocate(n);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const int32_t* channels = &channels_[h * kept];
    for (int64_t t = 0; t < n; ++t) {
      const int64_t from = h * rows_.capacity + t, to = h * capacity_ + t;
      for (int64_t j = 0; j < kept; ++j) keys_[to * kept + j] = rows_.k[from * d + channels[j]];
      std::copy_n(&rows_.v[from * d], d, &values_[to * d]);
      positions_[to] = rows_.positions[from];
    }
  }
  n_tokens_ = n;
  rows_ = HeadRows(n_kv_heads_, head_dim_);
  std::vector<float>().swap(window_q_);
  window_rows_ = 0;
  pruned_ = true;
}

void ThinkLayerKv::settle() {
  std::vector<float>().swap(view_k_);
  if (!pruned_) prune();
}

int64_t ThinkLayerKv::attend(const AttentionQuery& query, const PageSelection* pages) const {
  if (!pruned_) {
    pages ? attention_pages_cpu(query, rows_.view(), *pages)
          : attention_dense_cpu(query, rows_.view());
    const int64_t token_bytes = 2LL * head_dim_ * sizeof(float) + sizeof(int32_t);
    return token_bytes * (pages ? selected_slots(*pages, n_kv_heads_, rows_.n_tokens)
                                : n_kv_heads_ * rows_.n_tokens);
  }
  // Each key tile read as its kept channels, scattered into zeroed rows.
  const int64_t kept = n_kept_, d = head_dim_;
  const auto decode = [this, kept, d](int32_t kvh, int64_t start, int32_t n, float* k, float* v,
                                      int32_t* positions) {
    const int32_t* channels = &channels_[kvh * kept];
    std::fill_n(k, n * d, 0.f);
    for (int32_t i = 0; i < n; ++i) {
      const int64_t slot = kvh * capacity_ + start + i;
      for (int64_t j = 0; j < kept; ++j) k[i * d + channels[j]] = keys_[slot * kept + j];
      std::copy_n(&values_[slot * d], d, v + i * d);
      positions[i] = positions_[slot];
    }
  };
  attention_decoded_cpu(query, n_kv_heads_, head_dim_, n_tokens_, pages, decode);
  const int64_t token_bytes = (kept + d) * sizeof(float) + sizeof(int32_t);
  return token_bytes *
         (pages ? selected_slots(*pages, n_kv_heads_, n_tokens_) : n_kv_heads_ * n_tokens_);
}

void ThinkLayerKv::retain(RetainPlan& plan) {
  std::vector<float>().swap(view_k_);
  evicted_ = true;
  if (!pruned_) {
    retain_rows_in_place(rows_.k.data(), rows_.v.data(), rows_.positions.data(), n_kv_heads_,
                         head_dim_, rows_.capacity, rows_.n_tokens, plan);
    rows_.n_tokens = plan.n_keep;
    if (retain_shrinks(rows_.capacity, rows_.n_tokens)) rows_.reallocate(rows_.n_tokens);
    return;
  }
  const int64_t n_keep = plan.n_keep, kept = n_kept_, d = head_dim_;
  assert(static_cast<int64_t>(plan.slots.size()) == n_keep * n_kv_heads_);
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    int32_t* keep = plan.slots.data() + h * n_keep;
    const int64_t head = h * capacity_;
    const int32_t* channels = &channels_[h * kept];
    if (!plan.k.empty()) {  // merged rows arrive whole: their kept channels go in place
      for (int64_t j = 0; j < n_keep; ++j) {
        const float* k = &plan.k[(h * n_keep + j) * d];
        for (int64_t c = 0; c < kept; ++c) keys_[(head + keep[j]) * kept + c] = k[channels[c]];
        std::copy_n(&plan.v[(h * n_keep + j) * d], d, &values_[(head + keep[j]) * d]);
      }
    }
    place_kept_slots(keep, n_keep, n_keep);
    for (int64_t j = 0; j < n_keep; ++j) {  // keep[j] >= j: a row is read before it is written
      const int64_t from = keep[j];
      if (from == j) continue;
      std::copy_n(&keys_[(head + from) * kept], kept, &keys_[(head + j) * kept]);
      std::copy_n(&values_[(head + from) * d], d, &values_[(head + j) * d]);
      positions_[head + j] = positions_[head + from];
    }
  }
  n_tokens_ = n_keep;
  if (retain_shrinks(capacity_, n_tokens_)) reallocate(n_tokens_);
}

DenseKv ThinkLayerKv::view() const {
  if (!pruned_) return rows_.view();
  // Keys widened at the store's capacity with zeros in the pruned channels; values and
  // positions read in place.
  const int64_t kept = n_kept_, d = head_dim_;
  if (view_k_.empty() && n_tokens_ > 0) {
    view_k_.assign(static_cast<size_t>(n_kv_heads_ * capacity_ * d), 0.f);
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const int32_t* channels = &channels_[h * kept];
      for (int64_t t = 0; t < n_tokens_; ++t) {
        const int64_t slot = h * capacity_ + t;
        for (int64_t j = 0; j < kept; ++j) view_k_[slot * d + channels[j]] = keys_[slot * kept + j];
      }
    }
  }
  return DenseKv{view_k_.data(), values_.data(), positions_.data(), n_kv_heads_,
                 head_dim_,      capacity_,      n_tokens_};
}

std::unique_ptr<LayerKv> ThinkLayerKv::clone() const {
  auto copy = std::make_unique<ThinkLayerKv>(*this);
  std::vector<float>().swap(copy->view_k_);
  return copy;
}

int64_t ThinkLayerKv::bytes_resident() const {
  return rows_.bytes() + vector_bytes(window_q_) + vector_bytes(channels_) + vector_bytes(keys_) +
         vector_bytes(values_) + vector_bytes(positions_);
}

std::vector<int32_t> ThinkLayerKv::kept_channels(int32_t h) const {
  if (!pruned_) return {};
  return std::vector<int32_t>(channels_.begin() + h * n_kept_,
                              channels_.begin() + (h + 1) * n_kept_);
}

// Registered as `think` (methods/method_list.cpp).
MethodInfo think_method() {
  MethodInfo info;
  info.name = "think";
  info.kind = MethodKind::Storage;
  info.stage =
      "2 storage: key channels pruned once the context is in (the store's first settle); "
      "later keys stored with the same channels";
  info.summary =
      "per KV head, the `channels` fraction of key channels with the least query-key "
      "interaction (mean q_c^2 over the last `window` context queries x mean k_c^2) pruned and "
      "not stored; values whole";
  info.paper =
      "ThinK: Thinner Key Cache by Query-Driven Pruning (Xu et al., ICLR 2025), arXiv 2407.21018";
  info.choices = {
      "score as the authors' code and kvpress: mean q_c^2 over the window times mean k_c^2 "
      "over the held keys; GQA: q_c^2 averaged over the query heads of the group (kvpress)",
      "channels 0.4 by default, the authors' ratio (kvpress's default 0 prunes nothing); "
      "int(head_dim * channels) pruned",
      "pruned channels are not stored (kvpress zeroes them and saves nothing); attention "
      "scatters the kept channels into zeroed rows, the same as zeroed keys bit for bit",
      "every key held after the context is pruned, later tokens too (same channels); the "
      "authors keep the newest 32 context keys and later keys whole, kvpress later keys",
      "the window is the last `window` queries of the context's forwards, kept by the store "
      "until the context ends (counted in its bytes); so it composes behind an eviction "
      "method (snapkv:ratio=0.5+think: channels chosen on the keys SnapKV kept, as the "
      "authors' update_thinkv), but cannot fork from a shared prefill (it prefills alone)",
      "no budget or ratio: a sweep runs think alone once, and snapkv+think at each budget",
  };
  info.params = {
      float_param("channels", "0.4", 0, 1,
                  "fraction of each KV head's key channels pruned (below 1)"),
      int_param("window", 32, 1, kMaxTokens, "context queries that score the channels"),
  };
  info.store_observes_queries = true;
  info.check = [](const MethodParams& params) {
    if (params.get_float("channels") >= 1) {
      throw InputError("think: channels must be below 1 (at least one key channel is kept), not " +
                       params.get("channels"));
    }
  };
  info.make_layers = [](const MethodParams& params, const KvShape& shape) {
    ThinkConfig config;
    config.channels = params.get_float("channels");
    config.window = params.get_int("window");
    std::vector<std::unique_ptr<LayerKv>> layers;
    for (int32_t i = 0; i < shape.n_layers; ++i) {
      layers.push_back(std::make_unique<ThinkLayerKv>(shape.n_kv_heads, shape.head_dim, config));
    }
    return layers;
  };
  return info;
}

}  // namespace kvbench
