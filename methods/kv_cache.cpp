#include "methods/kv_cache.h"

#include <algorithm>
#include <cassert>

namespace kvbench {

KvCache::KvCache(KvShape shape, std::vector<std::unique_ptr<LayerKv>> layers)
    : shape_(shape), layers_(std::move(layers)) {
  assert(static_cast<int32_t>(layers_.size()) == shape_.n_layers);
  bytes_peak_ = bytes_resident();
}

void KvCache::advance(int32_t n_tokens) {
  next_position_ += n_tokens;
  bytes_peak_ = std::max(bytes_peak_, bytes_resident());
}

void KvCache::reserve(int64_t n_tokens) {
  for (auto& layer : layers_) layer->reserve(n_tokens);
  bytes_peak_ = std::max(bytes_peak_, bytes_resident());
}

int64_t KvCache::bytes_resident() const {
  int64_t total = 0;
  for (const auto& layer : layers_) total += layer->bytes_resident();
  return total;
}

CacheStats KvCache::stats() const {
  CacheStats stats;
  for (const auto& layer : layers_) {
    stats.tokens_per_layer.push_back(layer->n_tokens());
    stats.bytes_per_layer.push_back(layer->bytes_resident());
    stats.bytes_resident += layer->bytes_resident();
  }
  stats.bytes_peak = std::max(bytes_peak_, stats.bytes_resident);
  return stats;
}

}  // namespace kvbench
