// Sparse prefill patterns (SCBench stage 1): the KV cache stays full; each prefill chunk's
// attention reads only the keys of a pattern (kernels/cpu/attention.h attention_sparse_cpu).
//   a_shape    every query reads the first `sink` positions and the last `local` positions
//              up to its own (StreamingLLM's sink + window, as a prefill mask).
//   tri_shape  a_shape, and the prompt's last `last` query rows read every key.
//   minference per query head, from the attention of the chunk's last `last_q` queries
//              (softmax over the keys they see): the `vertical` key columns with the most
//              attention summed over those queries, and the `slash` diagonals (query - key
//              offsets) with the most attention summed along them; the first 30 columns and
//              the 30 nearest diagonals are always kept. Each query reads a key iff it lies
//              on a kept column or a kept diagonal.
//
// Authors' settings (microsoft/MInference):
//   minference/models_patch.py: a_shape n_init=128, n_local=3968; tri_shape also n_last=100.
//   minference/ops/streaming_kernel.py a_shape_kernel / tri_shape_kernel (the last n_last
//   query rows dense over every key, the others A-shape).
//   minference/modules/minference_forward.py gather_last_q_vertical_slash_topk_v4:
//   last_q=64, vertical_size=min(q_len, max(v, 30)), slash_size=min(q_len, max(s, 50)),
//   vertical[..., :30] = inf, slash[..., -30:] = inf, top-k of each; (v, s) per head from an
//   offline search (configs/Qwen2.5_7B_Instruct_128k_..._best_pattern.json: (1000, 6096),
//   (3500, 100), (500, 700), (30, 800), ...). Those are sized for 128K contexts.
#include "methods/sparse_prefill.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

#include "cache/registry.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/scores.h"

namespace kvbench {
namespace {

constexpr int32_t kNoDenseRows = std::numeric_limits<int32_t>::max();
constexpr int32_t kMinVertical = 30;  // the authors' max(vertical_size, 30)
constexpr int32_t kMinSlash = 50;     // the authors' max(slash_size, 50)

// MInference's estimate: per query head, attention of the chunk's last queries summed per key
// position (vertical) and per query - key offset (slash), over positions [0, span).
void estimate_vertical_slash(const AttentionQuery& query, const DenseKv& kv, int32_t last_q,
                             int64_t span, std::vector<float>& vertical,
                             std::vector<float>& slash) {
  const int32_t dim = kv.head_dim;
  const int32_t group = query.n_heads / kv.n_kv_heads;
  vertical.assign(static_cast<size_t>(query.n_heads * span), 0.0f);
  slash.assign(vertical.size(), 0.0f);
  // The last rows scored together (the GEMM path), in slices of at most about 64 MiB of
  // probabilities.
  const int64_t row_floats = static_cast<int64_t>(query.n_heads) * kv.n_tokens;
  const int32_t slice =
      static_cast<int32_t>(std::max<int64_t>(1, (int64_t{16} << 20) / row_floats));
  std::vector<float> p;
  for (int32_t first = query.n_queries - std::min(last_q, query.n_queries);
       first < query.n_queries; first += slice) {
    AttentionQuery rows = query;
    rows.q += static_cast<int64_t>(first) * query.n_heads * dim;
    rows.q_positions += first;
    rows.n_queries = std::min(slice, query.n_queries - first);
    p.resize(static_cast<size_t>(rows.n_queries * row_floats));
    attention_row_scores_cpu(rows, kv, p.data());  // [rows, n_heads, n_tokens]
    for (int32_t i = 0; i < rows.n_queries; ++i) {
      const int32_t qp = rows.q_positions[i];
      for (int32_t h = 0; h < query.n_heads; ++h) {
        const int32_t* pos = kv.positions + static_cast<int64_t>(h / group) * kv.capacity;
        const float* ph = p.data() + (i * query.n_heads + h) * kv.n_tokens;
        float* vh = vertical.data() + h * span;
        float* sh = slash.data() + h * span;
        for (int64_t t = 0; t < kv.n_tokens; ++t) {
          if (pos[t] > qp) continue;
          vh[pos[t]] += ph[t];
          sh[qp - pos[t]] += ph[t];
        }
      }
    }
  }
}

// The k highest of each head's [span] scores after forcing the first `forced` entries.
std::vector<int32_t> top_per_head(std::vector<float>& scores, int32_t n_heads, int64_t span,
                                  int32_t forced, int32_t k) {
  for (int32_t h = 0; h < n_heads; ++h) {
    for (int64_t x = 0; x < std::min<int64_t>(forced, span); ++x) {
      scores[h * span + x] = std::numeric_limits<float>::infinity();
    }
  }
  std::vector<int32_t> picked(static_cast<size_t>(n_heads) * k);
  top_k_indices_cpu(scores.data(), n_heads, span, k, picked.data());
  return picked;
}

}  // namespace

BuiltPattern SparsePrefill::pattern(const AttentionQuery& query, const DenseKv& kv,
                                    int64_t prompt_end) const {
  BuiltPattern built;
  SparsePattern& p = built.pattern;
  p.dense_from = kNoDenseRows;
  if (rule_.shape != SparsePrefillRule::Shape::MInference) {
    p.sink = rule_.sink;
    p.local = rule_.local;
    if (rule_.shape == SparsePrefillRule::Shape::TriShape) {
      int64_t end = prompt_end;
      for (int32_t i = 0; i < query.n_queries; ++i) {
        end = std::max<int64_t>(end, static_cast<int64_t>(query.q_positions[i]) + 1);
      }
      p.dense_from = static_cast<int32_t>(std::max<int64_t>(0, end - rule_.last));
    }
    return built;
  }
  if (query.n_queries <= 0) return built;
  int32_t last_position = 0;
  for (int32_t i = 0; i < query.n_queries; ++i) {
    last_position = std::max(last_position, query.q_positions[i]);
  }
  const int64_t span = static_cast<int64_t>(last_position) + 1;  // the authors' q_len
  std::vector<float> vertical, slash;
  estimate_vertical_slash(query, kv, rule_.last_q, span, vertical, slash);
  p.n_columns = static_cast<int32_t>(std::min<int64_t>(span, rule_.vertical));
  p.n_offsets = static_cast<int32_t>(std::min<int64_t>(span, rule_.slash));
  built.columns = top_per_head(vertical, query.n_heads, span, kForcedVertical, p.n_columns);
  built.offsets = top_per_head(slash, query.n_heads, span, kForcedSlash, p.n_offsets);
  p.columns = built.columns.data();
  p.offsets = built.offsets.data();
  return built;
}

AttentionPairs SparsePrefill::attend(const AttentionQuery& query, const DenseKv& kv,
                                     int64_t prompt_end) const {
  const BuiltPattern built = pattern(query, kv, prompt_end);
  return attention_sparse_cpu(query, kv, built.pattern);
}

namespace {

MethodInfo prefill_info(const std::string& name) {
  MethodInfo info;
  info.name = name;
  info.kind = MethodKind::Prefill;
  info.stage = "1 (prefill): every prefill forward (context and each turn's query); decode dense";
  return info;
}

const char* const kScbenchPaper =
    "SCBench: A KV Cache-Centric Analysis of Long-Context Methods (Li et al., ICLR 2025), "
    "arXiv 2412.10319";

const char* const kChoiceFullCache =
    "the KV cache stays full; alone it is the full cache with a sparse prefill, and it "
    "composes with eviction, storage and retrieval methods (a_shape+snapkv:ratio=0.5)";
const char* const kChoiceFlops =
    "attn_flops counts the pattern's query-key pairs (4 * head_dim FLOPs each per query "
    "head); the CPU kernel computes whole tiles of 64 keys that some query of its tile reads, "
    "masking the rest, so its time falls by tiles, as the authors' block-sparse kernels";
const char* const kChoiceDevice =
    "on --device cuda the attention runs on the GPU (attention_sparse_cuda: 64-slot tiles no "
    "query head of a block reads are skipped unloaded); the pattern is chosen and the pairs "
    "counted on the host, from the positions copied down";
const char* const kChoiceTurns =
    "every prefill forward reads the pattern: the context's and, after it, each turn's query "
    "and appended answer (a question of tens of tokens then sees the sink and its local "
    "window only, Tri-shape's last rows and MInference's columns aside); queries=dense keeps "
    "the pattern to the context's prefill";
const char* const kChoiceChunks =
    "prefill runs in chunks of 512 tokens: each chunk's attention over all keys before it is "
    "sparse; the prompt's end (Tri-shape's dense rows) is the forward's end";

ParamInfo sink_param() {
  return int_param("sink", 16, 0, kMaxTokens,
                   "first positions every prefill query reads (the authors' n_init)");
}
ParamInfo local_param() {
  return int_param("local", 112, 1, kMaxTokens,
                   "positions up to its own each prefill query reads (the authors' n_local)");
}
ParamInfo queries_param() {
  return choice_param("queries", "", {"sparse", "dense"},
                      "dense: only the context's prefill reads the pattern, each turn's query "
                      "and appended answer attend densely (as decode does); default sparse");
}
bool dense_queries(const MethodParams& params) {
  return params.has("queries") && params.get("queries") == "dense";
}

SparsePrefillRule shape_rule(const MethodParams& params, SparsePrefillRule::Shape shape) {
  SparsePrefillRule rule;
  rule.shape = shape;
  rule.sink = static_cast<int32_t>(params.get_int("sink"));
  rule.local = static_cast<int32_t>(params.get_int("local"));
  if (params.has("last")) rule.last = static_cast<int32_t>(params.get_int("last"));
  rule.dense_queries = dense_queries(params);
  return rule;
}

}  // namespace

MethodInfo a_shape_method() {
  MethodInfo info = prefill_info("a_shape");
  info.summary = "prefill queries read the first `sink` and the last `local` positions only";
  info.paper = std::string(kScbenchPaper) +
               "; the pattern is StreamingLLM's (Xiao et al., ICLR 2024, arXiv 2309.17453)";
  info.choices = {
      "sink=16, local=112 (128 keys per query) where the authors use n_init=128, "
      "n_local=3968 (4096 of 128K contexts): scaled for kvbench's 0.5-2K-token tasks",
      kChoiceFullCache, kChoiceTurns, kChoiceFlops, kChoiceChunks, kChoiceDevice,
  };
  info.params = {sink_param(), local_param(), queries_param()};
  info.make_prefill = [](const MethodParams& params) {
    return std::make_shared<const SparsePrefill>(
        shape_rule(params, SparsePrefillRule::Shape::AShape));
  };
  return info;
}

MethodInfo tri_shape_method() {
  MethodInfo info = prefill_info("tri_shape");
  info.summary = "a_shape, and the prompt's last `last` query rows read every key";
  info.paper = kScbenchPaper;
  info.choices = {
      "sink=16, local=112 where the authors use n_init=128, n_local=3968 (128K contexts); "
      "last=64 where their tri_shape_kernel defaults to n_last=100: kvbench's questions are "
      "tens of tokens",
      kChoiceFullCache, kChoiceTurns, kChoiceFlops, kChoiceChunks, kChoiceDevice,
  };
  info.params = {sink_param(), local_param(),
                 int_param("last", 64, 0, kMaxTokens,
                           "the prompt's last query rows that read every key (n_last)"),
                 queries_param()};
  info.make_prefill = [](const MethodParams& params) {
    return std::make_shared<const SparsePrefill>(
        shape_rule(params, SparsePrefillRule::Shape::TriShape));
  };
  return info;
}

MethodInfo minference_method() {
  MethodInfo info = prefill_info("minference");
  info.summary =
      "per query head, the key columns and diagonals the chunk's last queries attend most";
  info.paper =
      "MInference 1.0: Accelerating Pre-filling for Long-Context LLMs via Dynamic Sparse "
      "Attention (Jiang et al., NeurIPS 2024), arXiv 2407.02490";
  info.choices = {
      "vertical-slash only, one (vertical, slash) for every head: the authors pick each "
      "head's pattern kind (vertical-slash, block-sparse, A-shape) and sizes by an offline "
      "search; kvbench has no block-sparse heads",
      "vertical=64, slash=128 where the authors' searched sizes are (1000, 6096), "
      "(3500, 100), ... at 128K contexts: scaled for kvbench's 0.5-2K-token tasks; their "
      "floors (30, 50) and the 30 forced first columns and nearest diagonals are kept",
      "the estimate uses each chunk's last `last_q` queries (the whole prompt's are not yet "
      "computed when an earlier chunk attends); columns are key positions, diagonals "
      "query - key position offsets",
      "kept keys are exact columns and diagonals; the authors' GPU kernel covers diagonals "
      "in 64-key blocks",
      "on --device cuda the attention runs on the GPU as a_shape's; the estimate runs on the "
      "host, over copies of the chunk's last last_q query rows and the layer's keys (the CPU's "
      "code, so the same pattern), not on the device",
      kChoiceFullCache, kChoiceTurns, kChoiceFlops,
  };
  info.params = {
      int_param("last_q", 64, 1, 4096, "the chunk's last queries whose attention picks the "
                                       "pattern"),
      int_param("vertical", 64, kMinVertical, kMaxTokens,
                "key columns kept per query head, the first 30 included"),
      int_param("slash", 128, kMinSlash, kMaxTokens,
                "diagonals kept per query head, the 30 nearest included"),
      queries_param(),
  };
  info.make_prefill = [](const MethodParams& params) {
    SparsePrefillRule rule;
    rule.shape = SparsePrefillRule::Shape::MInference;
    rule.last_q = static_cast<int32_t>(params.get_int("last_q"));
    rule.vertical = static_cast<int32_t>(params.get_int("vertical"));
    rule.slash = static_cast<int32_t>(params.get_int("slash"));
    rule.dense_queries = dense_queries(params);
    return std::make_shared<const SparsePrefill>(rule);
  };
  return info;
}

}  // namespace kvbench
