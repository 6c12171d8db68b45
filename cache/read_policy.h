// Stage 3 of a cache method (docs/methods.md, "Adding a cache method"): retrieval at decode time. A
// read policy keeps metadata beside the stored KV and picks, per query, which pages attention
// reads; what is stored does not change (Quest saves reads, not memory).
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/layouts.h"

namespace kvbench {

class ReadPolicy {
 public:
  virtual ~ReadPolicy() = default;
  virtual std::unique_ptr<ReadPolicy> clone() const = 0;

  // `layer` stored n_new tokens at slots [first_slot, first_slot + n_new).
  // k: [n_new, n_kv_heads, head_dim], RoPE applied (the projection layout).
  virtual void appended(int32_t layer, const float* k, int64_t first_slot, int64_t n_new) = 0;

  // The pages a decode step's `query` (one row) reads in `layer`, which stores n_tokens,
  // or nullptr to read all of them; prefill never asks (KvCache::mark_decode_step). Adds the bytes the choice itself read (page metadata) to *bytes_read. The
  // selection stays valid until the next call.
  virtual const PageSelection* select(int32_t layer, const AttentionQuery& query, int64_t n_tokens,
                                      int64_t* bytes_read) = 0;

  // Bytes of metadata held for `layer`, counted in the layer's bytes.
  virtual int64_t bytes_resident(int32_t layer) const = 0;

  // The context is complete (KvCache::end_context): a reader that indexes it builds now.
  virtual void context_ended() {}

  // Recall of the true top keys, summed over the decode queries (steps, layers, query heads)
  // selected so far: |keys read ∩ exact top-k by q.k| / k each. Zero count: not measured.
  struct Recall {
    double sum = 0;
    int64_t count = 0;
  };
  virtual Recall recall() const { return {}; }
};

}  // namespace kvbench
