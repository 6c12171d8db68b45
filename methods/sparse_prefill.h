// Sparse prefill (SCBench's stage 1): the KV cache stays full, only the prefill's attention
// reads fewer keys. A-shape (sink + local window), Tri-shape (A-shape, the prompt's last
// rows dense) and MInference's vertical-slash pattern, chosen per query head from the
// chunk's last queries. KvCache::attend runs every prefill forward's attention through it;
// decode steps stay dense.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/prefill_attention.h"
#include "kernels/layouts.h"

namespace kvbench {

struct SparsePrefillRule {
  enum class Shape { AShape, TriShape, MInference };
  Shape shape = Shape::AShape;
  int32_t sink = 0;   // a_shape, tri_shape: the first positions every query reads
  int32_t local = 0;  // a_shape, tri_shape: the last positions up to each query's own
  int32_t last = 0;   // tri_shape: the prompt's last rows that read every key
  int32_t last_q = 64;    // minference: the chunk's last queries the pattern is estimated by
  int32_t vertical = 0;   // minference: key columns kept per query head
  int32_t slash = 0;      // minference: diagonals (query - key offsets) kept per query head
  bool dense_queries = false;  // the forwards after the context (queries, answers) dense
};

// MInference keeps the first columns and the nearest diagonals whatever the estimate says
// (minference_forward.py: vertical[..., :30] = inf, slash[..., -30:] = inf).
constexpr int32_t kForcedVertical = 30;
constexpr int32_t kForcedSlash = 30;

// A pattern and the lists its pointers refer to.
struct BuiltPattern {
  SparsePattern pattern{};
  std::vector<int32_t> columns;  // [n_heads, n_columns]
  std::vector<int32_t> offsets;  // [n_heads, n_offsets]
};

class SparsePrefill : public PrefillAttention {
 public:
  explicit SparsePrefill(SparsePrefillRule rule) : rule_(rule) {}
  const SparsePrefillRule& rule() const { return rule_; }

  // The pattern of a prefill chunk over `kv` (what is stored, the chunk included).
  // prompt_end is one past the prompt's last position (the forward's end; the chunk's own
  // end where that is unknown): Tri-shape's dense rows are the prompt's last `last`.
  BuiltPattern pattern(const AttentionQuery& query, const DenseKv& kv, int64_t prompt_end) const;

  // The chunk's attention with that pattern (attention_sparse_cpu; on a GPU
  // methods/cuda/sparse_prefill.h's, attention_sparse_cuda).
  AttentionPairs attend(const AttentionQuery& query, const DenseKv& kv,
                        int64_t prompt_end) const override;
  bool sparse_after_context() const override { return !rule_.dense_queries; }

 private:
  SparsePrefillRule rule_;
};

}  // namespace kvbench
