// EpiCache's block-wise prefill: the shared context is fed `chunk` tokens at a time, and
// after each block the cache (what was kept plus the new block) is scored and evicted down
// to the budget, so it never holds more than the budget plus one block. A token's score is
// KVzip-style: the softmax attention of a patched prompt's queries over every stored key,
// the max over the KV head's GQA group and over the prompt's rows; per KV head the top
// `budget` stay. Later tokens (queries, answers) are appended whole.
//
// The patched prompt here is the block's own last `window` queries (the authors'
// scoring_method=snapkv, which re-feeds the block's last snap_window_size tokens after it):
// each row over all stored keys, no causal mask among them, as the re-fed copies see the
// whole block. EpiCache's episodes are not done: it clusters the conversation's utterances
// with an external sentence encoder (k-means, 4 episodes), scores a cache per episode with
// an extraction instruction plus the episode's medoid text, and answers each question from
// the nearest episode's cache. A policy sees neither an encoder nor the utterances, so one
// cache serves every question (one episode).
//
// Authors' settings (apple/ml-epicache, model/wrapper.py prefill_memory_constrained,
// token_scoring, allocate_layer_budget; attention/score.py KVScore._get_score_flatten;
// attention/kvcache.py evict_flattened; args.py; METHODS-FACTS "EpiCache"):
// - prefill_chunk_size 2048, kv_budget 8192 (a block a quarter of the budget),
//   snap_window_size 64, scoring_method clustering (default) or snapkv, kvzip, ...
// - level pair: head-wise budgets, top budget x n_kv_heads over the layer's flattened
//   heads; pair-uniform: every KV head the same budget (kvbench's stores hold equal counts
//   per head, so uniform is what is done).
// - power 0 in args.py (every layer the same budget); the scripts' power 1.3 allocates
//   layers by a sensitivity profiled offline (a block-masked forward), not done here.
// - the re-fed window sits at positions from the block's last one on; here the queries
//   keep their own positions (window - 1 earlier), so their RoPE differs by that shift.
#include <algorithm>
#include <cmath>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"

namespace kvbench {
namespace {

class EpiCachePolicy : public TokenPolicy {
 public:
  EpiCachePolicy(const Budget& budget, int64_t chunk, int64_t window, int32_t n_layers)
      : budget_(budget),
        chunk_(chunk),
        window_(window),
        scores_(n_layers),
        seen_(n_layers, 0),
        closed_(n_layers, false) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<EpiCachePolicy>(*this);
  }

  int64_t context_block() const override { return chunk_; }

  // The forward's last `window` rows score every stored key: [n_kv_heads, n_tokens], the
  // max over the GQA group and the rows of each softmax over all stored keys. The rows are
  // given the last row's position, so the causal mask hides no stored key from any of them.
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    const int64_t n = kv.n_tokens;
    const int32_t d = kv.head_dim, group = query.n_heads / kv.n_kv_heads;
    const int32_t last_position = query.q_positions[query.n_queries - 1];
    seen_[layer] = std::max<int64_t>(seen_[layer], last_position + 1);
    const int32_t rows = std::min<int32_t>(query.n_queries, static_cast<int32_t>(window_));
    const std::vector<int32_t> positions(static_cast<size_t>(rows), last_position);
    AttentionQuery window = query;
    window.q += static_cast<int64_t>(query.n_queries - rows) * query.n_heads * d;
    window.q_positions = positions.data();
    window.n_queries = rows;
    probs_.resize(static_cast<size_t>(rows) * query.n_heads * n);
    attention_row_scores_cpu(window, kv, probs_.data());
    std::vector<float>& score = scores_[layer];
    score.assign(static_cast<size_t>(kv.n_kv_heads) * n, 0.f);
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t h = 0; h < query.n_heads; ++h) {
        const float* p = probs_.data() + (static_cast<int64_t>(r) * query.n_heads + h) * n;
        float* out = score.data() + (h / group) * n;
        for (int64_t t = 0; t < n; ++t) out[t] = std::max(out[t], p[t]);
      }
    }
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (closed_[layer]) return false;
    if (phase != CachePhase::ContextChunk) closed_[layer] = true;
    std::vector<float> score = std::move(scores_[layer]);
    scores_[layer] = std::vector<float>();
    const int64_t n = kv.n_tokens;
    // A ratio is of the context read so far (its length is not known while it streams):
    // after the last block, of the whole context.
    const int64_t limit = budget_.resolve(seen_[layer]);
    if (n <= limit || score.size() != static_cast<size_t>(kv.n_kv_heads) * n) return false;
    plan_top_k_per_head(score.data(), kv.n_kv_heads, n, limit, plan);
    return true;
  }

  int64_t bytes_resident(int32_t layer) const override { return vector_bytes(scores_[layer]); }
  bool done(int32_t layer) const override { return closed_[layer]; }

 private:
  Budget budget_;
  int64_t chunk_;
  int64_t window_;
  std::vector<std::vector<float>> scores_;  // per layer: the last forward's, until planned
  std::vector<int64_t> seen_;               // per layer: context tokens read (queries seen)
  std::vector<bool> closed_;                // per layer: the context has ended
  std::vector<float> probs_;                // observe's scratch: [rows, n_heads, n_tokens]
};

}  // namespace

// Registered as `epicache` (methods/method_list.cpp).
MethodInfo epicache_method() {
  MethodInfo info;
  info.name = "epicache";
  info.kind = MethodKind::Eviction;
  info.stage =
      "2: during the prefill, after every `chunk` context tokens (the cache never above the "
      "budget plus one block); later tokens are kept uncompressed";
  info.summary =
      "block-wise prefill under the budget: after each block, per KV head, the tokens most "
      "attended by the block's last `window` queries (softmax over every stored key, max "
      "over the GQA group and the rows)";
  info.paper =
      "EpiCache: Episodic KV Cache Management for Long Conversational Question Answering "
      "(Kim, Kundu, Kim, Dixit, Cho; Apple, 2025), arXiv 2509.17396";
  info.choices = {
      "NO EPISODES: the authors cluster the conversation's utterances with an external "
      "sentence encoder into episodes, keep one cache per episode scored by its medoid "
      "text, and route each question to the nearest; kvbench has no encoder or utterances "
      "inside a policy, so one cache serves every question",
      "scoring: the block's own last `window` (64) queries, the authors' scoring_method="
      "snapkv (their default, clustering, scores with the episode's patched prompt); rows "
      "see every stored key, at their own positions (the authors re-feed them after the "
      "block)",
      "budgets: every KV head and layer the same (the authors' pair-uniform level, power "
      "0 as args.py); their head-wise level and the layer allocation from an offline "
      "sensitivity profile are not done",
      "chunk default 128 (the authors' 2048 is a quarter of their 8192 budget; kvbench's "
      "contexts are 0.5K-8K and a forward feeds at most 512)",
      "ratio=: a fraction of the context read so far after each block (the whole length "
      "is unknown while it streams), so the whole context's fraction after the last; "
      "budget= is the authors' fixed budget",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(int_param("chunk", 128, 1, static_cast<double>(kPrefillChunk),
                                  "context tokens per block; each block is followed by an "
                                  "eviction to the budget"));
  info.params.push_back(int_param("window", 64, 1, kMaxTokens,
                                  "the block's last `window` queries score the stored keys"));
  info.check = [](const MethodParams& params) { check_budget(params); };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(new EpiCachePolicy(
        budget_from(params), params.get_int("chunk"), params.get_int("window"), shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
