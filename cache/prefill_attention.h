// Stage 1's seam: a prefill method (a_shape, tri_shape, minference: methods/sparse_prefill.h)
// runs every prefill forward's attention itself, reading fewer keys; the cache stays full and
// decode steps stay dense (KvCache::attend), as do the forwards after the context (each
// turn's query, the appended answers) when sparse_after_context() is false.
#pragma once

#include <cstdint>

#include "kernels/layouts.h"

namespace kvbench {

class PrefillAttention {
 public:
  virtual ~PrefillAttention() = default;
  // The attention of a prefill chunk's queries over `kv` (what is stored, the chunk
  // included), written to query.out. prompt_end is one past the prompt's last position (the
  // forward's end). Returns the query-key pairs computed, and those dense causal attention
  // of the same rows computes.
  virtual AttentionPairs attend(const AttentionQuery& query, const DenseKv& kv,
                                int64_t prompt_end) const = 0;
  // Whether the forwards after the context ended (each turn's query and appended answer)
  // read the pattern too; false: only the context's prefill is sparse.
  virtual bool sparse_after_context() const { return true; }
};

}  // namespace kvbench
