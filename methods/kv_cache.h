// The KV-store interface: attention reads keys and values only through it, so a cache
// method (eviction, quantization, retrieval, ...) changes what attention sees by
// implementing LayerKv. Framework-free: raw pointers in the layouts of kernels/layouts.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/layouts.h"

namespace kvbench {

// Shape of one sequence's cache.
struct KvShape {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
};

// What a cache holds, measured from its storage. The one way a method reports itself.
struct CacheStats {
  std::vector<int64_t> tokens_per_layer;  // tokens stored, per layer
  std::vector<int64_t> bytes_per_layer;   // bytes allocated for KV (and metadata), per layer
  int64_t bytes_resident = 0;             // sum of bytes_per_layer
  int64_t bytes_peak = 0;                 // largest bytes_resident seen since creation / reset_peak
};

// One layer of one sequence.
class LayerKv {
 public:
  virtual ~LayerKv() = default;
  // Makes room for n_tokens in total, so a known-length prompt allocates once.
  virtual void reserve(int64_t n_tokens) = 0;
  // Stores new tokens. k, v: [n_new, n_kv_heads, head_dim] (projection output, RoPE applied
  // to k); positions: [n_new].
  virtual void append(const float* k, const float* v, const int32_t* positions,
                      int64_t n_new) = 0;
  // Causal attention of a chunk's queries over what is stored (the chunk itself included).
  virtual void attend(const AttentionQuery& query) const = 0;
  virtual int64_t n_tokens() const = 0;
  virtual int64_t bytes_resident() const = 0;  // bytes this layer's storage really holds
};

// The cache of one sequence: a store per layer plus the next position to fill.
class KvCache {
 public:
  KvCache(KvShape shape, std::vector<std::unique_ptr<LayerKv>> layers);

  const KvShape& shape() const { return shape_; }
  LayerKv& layer(int32_t i) { return *layers_[i]; }
  const LayerKv& layer(int32_t i) const { return *layers_[i]; }

  // Position of the next token fed to the model (tokens seen so far, evicted or not).
  int32_t next_position() const { return next_position_; }
  void advance(int32_t n_tokens);
  void reserve(int64_t n_tokens);

  int64_t bytes_resident() const;
  CacheStats stats() const;
  void reset_peak() { bytes_peak_ = bytes_resident(); }

 private:
  KvShape shape_;
  std::vector<std::unique_ptr<LayerKv>> layers_;
  int32_t next_position_ = 0;
  int64_t bytes_peak_ = 0;
};

}  // namespace kvbench
