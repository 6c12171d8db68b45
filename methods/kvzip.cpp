// KVzip: query-agnostic scores from context reconstruction. After the shared context, the
// model is asked to repeat it (harness/reconstruction.h feeds the prompt through a copy of
// the cache, span by span); each context token scores the largest softmax attention any
// query of that forward pays it, over the GQA group's query heads and every query row. The
// softmax of each row runs over the chat head, the span being repeated and the prompt
// itself (causally), not over the rest of the context. The chat head (system prompt and
// user header, before the first span) is never evicted. Then every layer keeps its budget
// per KV head by top-k, once, at ContextEnd; later tokens are kept.
//
// Authors' settings (snu-mllab/KVzip 5d84729: attention/score.py KVScore._get_score,
// model/wrapper.py self_task and scoring, attention/kvcache.py prune; arXiv 2505.23416):
// - evict_range starts after the system prompt, which is kept and is the softmax's "sink";
// - spans of 2000 context tokens; later spans' prompt ends with the previous span's last 8
//   tokens; scores in the model dtype, softmax not in fp32;
// - level "pair" (default): one threshold over all layers and heads (ragged heads);
//   "pair-uniform": each layer's heads keep int(n * ratio) by top-k.
// kvpress KVzipPress (8bb29b9) ports it with spans of 2048 and 4 sinks in place of the
// system prompt, whose other tokens then score 0 and go first.
// Here: both levels (`level`, "pair" by default as the authors'): "pair" keeps the
// layers' budgets summed over all layers and KV heads, the highest scores wherever they lie,
// so each head keeps its own count (ragged heads, cache/allocation.h). Scores in fp32; the
// budget counts the kept chat head.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "cache/allocation.h"
#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"
#include "kernels/cpu/tile_gemm.h"

namespace kvbench {
namespace {

class KvzipPolicy : public TokenPolicy {
 public:
  KvzipPolicy(const Budget& budget, const KvShape& shape, bool pair)
      : limits_(budget, shape.n_layers),
        pair_(pair),
        n_kv_heads_(shape.n_kv_heads),
        scores_(static_cast<size_t>(shape.n_layers)),
        compressed_(static_cast<size_t>(shape.n_layers), false) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<KvzipPolicy>(*this);
  }

  bool scores_by_reconstruction() const override { return true; }

  // The scores depend on the context and the forwards alone: budget and level only plan.
  bool adopt_scores(const TokenPolicy& scored) override {
    const auto* other = dynamic_cast<const KvzipPolicy*>(&scored);
    if (!other || other->n_kv_heads_ != n_kv_heads_ || other->scores_.size() != scores_.size() ||
        other->n_context_ == 0 || n_context_ != 0) {
      return false;
    }
    for (size_t l = 0; l < compressed_.size(); ++l) {
      if (compressed_[l] || other->compressed_[l]) return false;
    }
    scores_ = other->scores_;
    n_context_ = other->n_context_;
    head_ = other->head_;
    begin_ = other->begin_;
    end_ = other->end_;
    return true;
  }

  void reconstructing(int64_t begin, int64_t end, int64_t n_context) override {
    if (n_context_ != n_context) {  // the first span: the chat head before it scores 1
      n_context_ = n_context;
      head_ = begin;
      for (std::vector<float>& s : scores_) {
        s.assign(static_cast<size_t>(n_kv_heads_ * n_context), 0.f);
        for (int32_t h = 0; h < n_kv_heads_; ++h) {
          std::fill_n(s.begin() + h * n_context, head_, 1.f);
        }
      }
    }
    // The span is scored anew (the authors assign it once): the max over its prompt's rows,
    // which may come in several forward chunks, starting from 0.
    begin_ = begin;
    end_ = end;
    for (std::vector<float>& s : scores_) {
      for (int32_t h = 0; h < n_kv_heads_; ++h) {
        std::fill(s.begin() + h * n_context + begin, s.begin() + h * n_context + end, 0.f);
      }
    }
  }

  // Only the reconstruction prompt's queries score (those past the context); the
  // context's own prefill and any other forward are not looked at.
  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    if (end_ <= begin_ || query.q_positions[0] < n_context_) return;
    const int32_t d = kv.head_dim;
    const int32_t group = query.n_heads / kv.n_kv_heads;
    // Scratch of this call only: nothing is held between forwards but the scores.
    std::vector<int32_t> context_slots, prompt_slots, row_pos;
    std::vector<float> keys_t, query_rows, block_logits;
    std::vector<double> weights;
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      // The keys a row reads: the chat head and the span (any order), then the prompt's own
      // slots by position, of which a row reads those up to its own position.
      const int32_t* pos = kv.positions + h * kv.capacity;
      context_slots.clear();
      prompt_slots.clear();
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        if (pos[t] < head_ || (pos[t] >= begin_ && pos[t] < end_)) {
          context_slots.push_back(static_cast<int32_t>(t));
        } else if (pos[t] >= n_context_) {
          prompt_slots.push_back(static_cast<int32_t>(t));
        }
      }
      std::sort(prompt_slots.begin(), prompt_slots.end(),
                [pos](int32_t a, int32_t b) { return pos[a] < pos[b]; });
      // Those keys, transposed ([d][ld]), for the tile GEMM: one pass of every query row of
      // the block over them, where a scalar dot per (row, key) was most of a reconstruction.
      const int n_context_keys = static_cast<int>(context_slots.size());
      const int n_keys = n_context_keys + static_cast<int>(prompt_slots.size());
      const int ld = (n_keys + tile::kNr - 1) / tile::kNr * tile::kNr;
      keys_t.assign(static_cast<size_t>(d) * ld, 0.f);
      const float* k = kv.k + h * kv.capacity * d;
      for (int j = 0; j < n_keys; ++j) {
        const int32_t slot =
            j < n_context_keys ? context_slots[j] : prompt_slots[j - n_context_keys];
        const float* key = k + static_cast<int64_t>(slot) * d;
        for (int32_t c = 0; c < d; ++c) keys_t[static_cast<size_t>(c) * ld + j] = key[c];
      }
      weights.resize(static_cast<size_t>(n_context_keys));
      float* head_scores = scores_[layer].data() + h * n_context_;
      for (int32_t q0 = 0; q0 < query.n_queries; q0 += kQueryBlock) {
        const int32_t q1 = std::min(query.n_queries, q0 + kQueryBlock);
        const int rows = (q1 - q0) * group;
        query_rows.resize(static_cast<size_t>(rows) * d);
        row_pos.resize(static_cast<size_t>(rows));
        block_logits.resize(static_cast<size_t>(rows) * ld);
        tile::gather_query_rows(query, h, group, d, q0, q1, query.scale, query_rows.data(),
                                row_pos.data());
        gemm_cpu(rows, d, ld, query_rows.data(), d, keys_t.data(), ld, block_logits.data(), ld);
        for (int r = 0; r < rows; ++r) {
          // The prompt's keys this row reads: those at or before its position.
          const auto seen = std::upper_bound(
              prompt_slots.begin(), prompt_slots.end(), row_pos[r],
              [pos](int32_t p, int32_t slot) { return p < pos[slot]; });
          const int n_row_keys = n_context_keys + static_cast<int>(seen - prompt_slots.begin());
          if (n_row_keys == 0) continue;
          const float* logits = block_logits.data() + static_cast<int64_t>(r) * ld;
          const float top = *std::max_element(logits, logits + n_row_keys);
          double sum = 0;
          for (int j = 0; j < n_row_keys; ++j) {
            const double e = std::exp(static_cast<double>(logits[j] - top));
            if (j < n_context_keys) weights[j] = e;
            sum += e;
          }
          for (int j = 0; j < n_context_keys; ++j) {
            const int32_t p = pos[context_slots[j]];
            if (p < head_) continue;  // the chat head keeps its 1
            head_scores[p] = std::max(head_scores[p], static_cast<float>(weights[j] / sum));
          }
        }
      }
    }
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase != CachePhase::ContextEnd) return false;
    compressed_[layer] = true;
    const int64_t n = kv.n_tokens;
    const int64_t limit = limits_.resolve(layer, phase, n);
    const bool evict = limit >= 0 && n > limit;
    if (evict) {
      // A context never evicted before ContextEnd: slot t holds position t, every head.
      if (n_context_ != n) {
        throw std::logic_error("kvzip: the context was not reconstructed before its end");
      }
      if (pair_) {
        if (head_counts_.empty()) head_counts_ = pair_counts(phase, n);
        plan_top_k_ragged(scores_[layer].data(), n_kv_heads_, n, head_counts_[layer], plan);
      } else {
        plan_top_k_per_head(scores_[layer].data(), n_kv_heads_, n, limit, plan);
      }
    }
    std::vector<float>().swap(scores_[layer]);  // compressed for good: scores go
    return evict;
  }

  int64_t bytes_resident(int32_t layer) const override { return vector_bytes(scores_[layer]); }
  bool done(int32_t layer) const override { return compressed_[layer]; }

 private:
  // level=pair: every layer's budget summed, as many (layer, KV head, token) triples kept,
  // the highest scores first (ties: the lower layer, head, token); what each (layer, head)
  // keeps. Called at the first layer's ContextEnd, while every layer's scores are held (the
  // reconstruction scored them all).
  std::vector<std::vector<int64_t>> pair_counts(CachePhase phase, int64_t n) {
    const int32_t n_layers = static_cast<int32_t>(scores_.size());
    int64_t keep = 0;
    for (int32_t l = 0; l < n_layers; ++l) {
      keep += std::min(n, std::max<int64_t>(limits_.resolve(l, phase, n), 0)) * n_kv_heads_;
    }
    std::vector<int64_t> order;  // (layer, head, token) as l * heads * n + h * n + t
    order.reserve(static_cast<size_t>(n_layers) * n_kv_heads_ * n);
    for (int64_t i = 0; i < int64_t{n_layers} * n_kv_heads_ * n; ++i) order.push_back(i);
    const int64_t per_layer = int64_t{n_kv_heads_} * n;
    const auto score = [&](int64_t i) { return scores_[i / per_layer][i % per_layer]; };
    std::nth_element(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
      return score(a) != score(b) ? score(a) > score(b) : a < b;
    });
    std::vector<std::vector<int64_t>> counts(n_layers, std::vector<int64_t>(n_kv_heads_, 0));
    for (int64_t j = 0; j < keep; ++j) ++counts[order[j] / per_layer][order[j] % per_layer / n];
    return counts;
  }

  LayerLimits limits_;
  bool pair_;  // level=pair: one threshold over every layer and head (ragged heads)
  int32_t n_kv_heads_;
  static constexpr int32_t kQueryBlock = 16;  // query rows per GEMM (times the GQA group)
  std::vector<std::vector<float>> scores_;  // per layer [n_kv_heads, n_context], by position
  std::vector<bool> compressed_;
  int64_t n_context_ = 0;          // context tokens, once a reconstruction began
  int64_t head_ = 0;               // the chat head before the first span: kept
  int64_t begin_ = 0, end_ = 0;    // the span the next forward repeats
  std::vector<std::vector<int64_t>> head_counts_;  // level=pair: [layer][KV head] kept
};

}  // namespace

// Registered as `kvzip` (methods/method_list.cpp).
MethodInfo kvzip_method() {
  MethodInfo info;
  info.name = "kvzip";
  info.kind = MethodKind::Eviction;
  info.stage =
      "2: once, at the end of the shared context, after forwards that repeat it (counted in "
      "TTFT); later tokens are kept uncompressed";
  info.summary =
      "per KV head, the context tokens the model attends to most while asked to repeat the "
      "context (max over the GQA group and the prompt's rows): query-agnostic";
  info.paper =
      "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction (Kim et al., "
      "2025), arXiv 2505.23416";
  info.choices = {
      "rule, prompts and spans (2000 tokens) as the authors' snu-mllab/KVzip; the chat head "
      "(system prompt, user header) is kept and is the softmax's sink, as there (kvpress "
      "keeps 4 sinks and scores the rest of the head 0)",
      "level=pair (the authors' default): the budget summed over layers, one threshold over "
      "every layer and KV head, each head keeping its own count (on the CPU or the GPU, in "
      "the fp32 store or behind a storage method that holds heads apart: fp16, bf16, fp8, "
      "kivi); level=pair-uniform: each layer keeps its budget in each KV head",
      "the budget counts the kept chat head; scores and softmax in fp32",
      "the prompt runs on a copy of the cache, then dropped (the authors score without "
      "storing it); its bytes count in the peak, and its forwards in the prefill time",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(choice_param(
      "level", "pair", {"pair", "pair-uniform"},
      "pair: one threshold over all layers and KV heads (heads of their own); pair-uniform: "
      "each layer's budget in each KV head"));
  info.ragged_heads = true;  // level=pair
  info.check = [](const MethodParams& params) { check_budget(params); };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    return std::unique_ptr<TokenPolicy>(
        new KvzipPolicy(budget_from(params), shape, params.get("level") == "pair"));
  };
  return info;
}

}  // namespace kvbench
