// ChunkKV (Liu et al., arXiv 2502.00299): the context is cut into chunks of `chunk`
// consecutive tokens and whole chunks are kept or dropped, so what survives reads as
// phrases, not scattered tokens. Any token scorer ranks the chunks.
// Settings (kvpress ChunkKVPress, kvpress/presses/chunkkv_press.py, which the ChunkKV
// authors contributed; the paper's Algorithm 1):
// - token scores come from the wrapped scorer: snapkv (the last `window` context queries'
//   attention, GQA group averaged, pooled: methods/snapkv.h's snapkv_ranking) or knorm (minus
//   the key's L2 norm, kernels/cpu/scores.h key_norms_cpu);
// - chunk score = the token scores summed over KV heads, averaged over the chunk's tokens;
//   chunks start at position 0, the last may be shorter;
// - the top chunks are kept in every KV head alike (one index set per layer);
// - once, at the end of the shared context; later tokens are appended uncompressed.
// Choices where the sources leave room or differ:
// - snapkv: the window is kept whole and only the prefix is chunked, as the paper's Algorithm
//   1 (kvpress chunks the window too, giving it the top score, so it is kept all the same);
//   knorm has no window: the whole context is chunked, as kvpress;
// - the budget is held: chunks are taken in rank order while they fit (kvpress keeps
//   int(n_chunks * (1 - compression_ratio)) chunks, at least one, so it can run over by a
//   partial chunk); if not even the top chunk fits, its first tokens fill the budget;
// - layer-wise index reuse (the paper's section on it): with reuse=N, layer l keeps the
//   tokens layer l - l % N chose; the default 1 selects in every layer, as kvpress does.
#include <algorithm>
#include <numeric>
#include <vector>

#include "cache/budget.h"
#include "methods/snapkv.h"

namespace kvbench {

namespace {

enum class ChunkScorer { SnapKv, Knorm };

struct ChunkKvConfig {
  SnapKvConfig select;  // budget; window, kernel and pool for scorer=snapkv
  ChunkScorer scorer = ChunkScorer::SnapKv;
  int64_t chunk = 10;  // tokens per chunk
  int64_t reuse = 1;   // layers sharing one selection
};

// Tokens [first, first + n) of a chunk with its score.
struct ScoredChunk {
  int64_t first = 0, n = 0;
  double score = 0;
};

// Chunks of `chunk` tokens over [0, n_tokens), each scored by the mean of token_scores over it.
std::vector<ScoredChunk> score_chunks(const std::vector<double>& token_scores, int64_t n_tokens,
                                int64_t chunk) {
  std::vector<ScoredChunk> chunks;
  for (int64_t first = 0; first < n_tokens; first += chunk) {
    ScoredChunk c;
    c.first = first;
    c.n = std::min(chunk, n_tokens - first);
    for (int64_t t = first; t < first + c.n; ++t) c.score += token_scores[t];
    c.score /= static_cast<double>(c.n);
    chunks.push_back(c);
  }
  return chunks;
}

// The slots of the chunks kept within `keep` tokens, in rank order while they fit; if none
// fits, the top chunk's first `keep` tokens. Ascending.
std::vector<int32_t> keep_chunks(std::vector<ScoredChunk> chunks, int64_t keep) {
  std::stable_sort(chunks.begin(), chunks.end(),
                   [](const ScoredChunk& a, const ScoredChunk& b) { return a.score > b.score; });
  std::vector<int32_t> slots;
  for (const ScoredChunk& c : chunks) {
    if (static_cast<int64_t>(slots.size()) + c.n > keep) continue;
    for (int64_t t = c.first; t < c.first + c.n; ++t) slots.push_back(static_cast<int32_t>(t));
  }
  if (slots.empty() && keep > 0 && !chunks.empty()) {
    const ScoredChunk& top = chunks.front();
    for (int64_t t = top.first; t < top.first + std::min(keep, top.n); ++t) {
      slots.push_back(static_cast<int32_t>(t));
    }
  }
  std::sort(slots.begin(), slots.end());
  return slots;
}

// The key-norm scorer holds no window (size 0).
class ChunkKvPolicy : public WindowedPolicy {
 public:
  ChunkKvPolicy(const ChunkKvConfig& config, int32_t n_layers)
      : WindowedPolicy(config.select.budget,
                       config.scorer == ChunkScorer::SnapKv ? config.select.window : 0, n_layers),
        config_(config) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<ChunkKvPolicy>(*this);
  }

  int64_t bytes_resident(int32_t layer) const override {
    return WindowedPolicy::bytes_resident(layer) + group_slots_.bytes();
  }

 protected:
  bool select(int32_t layer, const DenseKv& kv, const QueryWindow& held, int64_t limit,
              RetainPlan& plan) override {
    // A layer inside a group keeps what the group's first layer chose.
    const std::vector<int32_t>& slots = group_slots_.slots(
        layer, config_.reuse, kv.n_tokens, limit, [&] { return choose(held, kv, limit); });
    plan_same_slots(slots, kv.n_kv_heads, plan);
    return true;
  }

 private:
  std::vector<int32_t> choose(const QueryWindow& held, const DenseKv& kv, int64_t limit) const {
    const int64_t n = kv.n_tokens;
    std::vector<double> token_scores(static_cast<size_t>(n), 0.0);
    int64_t window = 0;
    if (config_.scorer == ChunkScorer::SnapKv) {
      window = std::min(config_.select.window, limit);
      const std::vector<float> ranked =
          snapkv_ranking(held.kv_head_scores(kv), kv.n_kv_heads, n, window, config_.select);
      for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
        for (int64_t t = 0; t < n - window; ++t) token_scores[t] += ranked[h * n + t];
      }
    } else {
      std::vector<float> norms(static_cast<size_t>(kv.n_kv_heads * n));
      key_norms_cpu(kv, norms.data());
      for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
        for (int64_t t = 0; t < n; ++t) token_scores[t] -= norms[h * n + t];
      }
    }
    std::vector<int32_t> slots =
        keep_chunks(score_chunks(token_scores, n - window, config_.chunk), limit - window);
    for (int64_t t = n - window; t < n; ++t) slots.push_back(static_cast<int32_t>(t));
    return slots;
  }

  ChunkKvConfig config_;
  LayerGroupSlots group_slots_;
};

}  // namespace

// Registered as `chunkkv` (methods/method_list.cpp).
MethodInfo chunkkv_method() {
  MethodInfo info;
  info.name = "chunkkv";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "whole chunks of `chunk` consecutive tokens, ranked by a token scorer (snapkv's window "
      "attention or knorm's key norm) summed over KV heads and averaged over the chunk; the "
      "same chunks in every KV head";
  info.paper =
      "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM "
      "Inference (Liu et al., 2025), arXiv 2502.00299";
  info.choices = {
      "rule as kvpress ChunkKVPress (contributed by the authors): chunk score = scorer's "
      "token scores summed over heads, averaged over the chunk; one chunk set per layer",
      "chunk=10 is the paper's default (kvpress defaults to 20)",
      "scorer=snapkv keeps its window whole and chunks the prefix (the paper's Algorithm 1); "
      "scorer=knorm chunks the whole context (no window)",
      "the budget is held: chunks go in rank order while they fit (kvpress keeps "
      "int(n_chunks (1 - ratio)) chunks and may run over by a partial one)",
      "layer-wise index reuse: reuse=N makes each N layers share the first one's chunks; "
      "default 1 (every layer selects, as kvpress)",
  };
  info.params = snapkv_params();
  info.params.push_back(int_param("chunk", 10, 1, kMaxTokens, "tokens per chunk"));
  info.params.push_back(choice_param("scorer", "snapkv", {"snapkv", "knorm"},
                                     "token scores ranking the chunks: snapkv (window "
                                     "attention, window kept) or knorm (minus key L2 norm)"));
  info.params.push_back(int_param("reuse", 1, 1, kMaxTokens,
                                  "layers sharing one selection (layer-wise index reuse; 1: "
                                  "every layer selects)"));
  info.check = [](const MethodParams& params) {
    // knorm has no window, so the window-in-budget check is snapkv's alone.
    if (params.get("scorer") == "snapkv") return check_snapkv_params(params);
    check_budget(params);
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    ChunkKvConfig config;
    config.select = snapkv_config_from(params);
    config.scorer = params.get("scorer") == "knorm" ? ChunkScorer::Knorm : ChunkScorer::SnapKv;
    config.chunk = params.get_int("chunk");
    config.reuse = params.get_int("reuse");
    return std::unique_ptr<TokenPolicy>(new ChunkKvPolicy(config, shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
