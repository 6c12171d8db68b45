// Quest (Tang et al., ICML 2024): every layer keeps its whole KV; beside it, each page of
// `page` consecutive tokens records the elementwise minimum and maximum of its keys. At a
// decode step the query bounds each page's best logit, sum_d max(q_d min_d, q_d max_d), and
// attention reads only the top pages up to the token budget. Quest saves reads, not
// memory: CacheStats.bytes_read_last_forward shows what a step read.
//
// Choices where the paper leaves room:
// - GQA (the paper's models are MHA): a KV head reads the pages chosen by the largest bound
//   over its query heads, so a page one head needs is read.
// - The page holding the newest token is always read (the query must see itself).
// - Only decode steps select pages (KvCache asks the reader on them alone): prefill reads
//   everything, as Quest's prefill is dense, and so does a one-token prefill (a context's
//   last chunk, a turn query or a reuse remainder of one token), which Quest's own test
//   `q_len > 1` would sparsify. The first `dense_layers` layers (2) always read everything,
//   as in the paper.
// - A step reads max(min_pages, budget / page) pages (Quest's controller: at least 3), the
//   newest page among them.
// - A budget covering every page reads everything: the result is the full cache's. A ratio
//   budget is a fraction of the tokens stored at that step (nothing is dropped to resolve it
//   against).
// - Bounds are kept from the keys as they are stored, before any packing: over a KIVI store
//   (quest+kivi) they bound the fp32 keys, which ranks pages as the paper does.
#include "kernels/cpu/quest.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "cache/budget.h"
#include "cache/plan_helpers.h"
#include "cache/read_policy.h"
#include "cache/registry.h"
#include "kernels/cpu/scores.h"

namespace kvbench {

namespace {

struct QuestConfig {
  Budget budget;
  int32_t page = 16;
  int32_t dense_layers = 2;
  int32_t min_pages = 3;
};

class QuestReader : public ReadPolicy {
 public:
  QuestReader(const QuestConfig& config, const KvShape& shape)
      : config_(config), shape_(shape), layers_(shape.n_layers) {}

  std::unique_ptr<ReadPolicy> clone() const override {
    return std::make_unique<QuestReader>(*this);
  }

  void appended(int32_t layer, const float* k, int64_t first_slot, int64_t n_new) override {
    if (layer < config_.dense_layers || n_new == 0) return;
    LayerPages& p = layers_[layer];
    const int64_t need = (first_slot + n_new + config_.page - 1) / config_.page;
    if (need > p.capacity) grow(p, std::max(need, p.capacity + p.capacity / 2 + 16));
    PageBounds bounds = p.bounds(shape_, config_.page);
    page_bounds_append_cpu(bounds, k, first_slot, n_new);
    p.n_pages = bounds.n_pages;
  }

  const PageSelection* select(int32_t layer, const AttentionQuery& query, int64_t n_tokens,
                              int64_t* bytes_read) override {
    assert(query.n_queries == 1);  // a decode step
    if (layer < config_.dense_layers) return nullptr;
    LayerPages& p = layers_[layer];
    const int64_t n_pages = p.n_pages;
    const int64_t budget =
        config_.budget.is_ratio() ? config_.budget.resolve(n_tokens) : config_.budget.tokens;
    const int64_t n_select = std::max<int64_t>(config_.min_pages, budget / config_.page);
    if (n_select >= n_pages) return nullptr;
    const PageBounds bounds = p.bounds(shape_, config_.page);
    scores_.resize(static_cast<size_t>(shape_.n_kv_heads * n_pages));
    page_scores_cpu(query, 0, bounds, scores_.data());
    for (int32_t h = 0; h < shape_.n_kv_heads; ++h) {
      scores_[h * n_pages + n_pages - 1] = std::numeric_limits<float>::infinity();
    }
    selected_.resize(static_cast<size_t>(shape_.n_kv_heads * n_select));
    top_k_indices_cpu(scores_.data(), shape_.n_kv_heads, n_pages, n_select, selected_.data());
    *bytes_read += 2LL * shape_.n_kv_heads * n_pages * shape_.head_dim * sizeof(float);
    selection_ = PageSelection{selected_.data(), static_cast<int32_t>(n_select), config_.page};
    return &selection_;
  }

  int64_t bytes_resident(int32_t layer) const override {
    return vector_bytes(layers_[layer].k_min) + vector_bytes(layers_[layer].k_max);
  }

 private:
  struct LayerPages {
    std::vector<float> k_min, k_max;  // [n_kv_heads, capacity, head_dim]
    int64_t capacity = 0;
    int64_t n_pages = 0;
    PageBounds bounds(const KvShape& shape, int32_t page) {
      return PageBounds{k_min.data(), k_max.data(), shape.n_kv_heads, shape.head_dim,
                        page,         capacity,     n_pages};
    }
  };

  // Moves each head's pages to a buffer of `capacity` pages per head.
  void grow(LayerPages& p, int64_t capacity) const {
    const int64_t d = shape_.head_dim;
    std::vector<float> lo(static_cast<size_t>(shape_.n_kv_heads * capacity * d));
    std::vector<float> hi(lo.size());
    for (int32_t h = 0; h < shape_.n_kv_heads; ++h) {
      std::copy_n(p.k_min.begin() + h * p.capacity * d, p.n_pages * d,
                  lo.begin() + h * capacity * d);
      std::copy_n(p.k_max.begin() + h * p.capacity * d, p.n_pages * d,
                  hi.begin() + h * capacity * d);
    }
    p.k_min.swap(lo);
    p.k_max.swap(hi);
    p.capacity = capacity;
  }

  QuestConfig config_;
  KvShape shape_;
  std::vector<LayerPages> layers_;
  // Scratch of the last selection (select's result points into it).
  std::vector<float> scores_;
  std::vector<int32_t> selected_;
  PageSelection selection_{};
};

}  // namespace

// Registered as `quest` (methods/method_list.cpp).
MethodInfo quest_method() {
  MethodInfo info;
  info.name = "quest";
  info.kind = MethodKind::Retrieval;
  info.stage = "3: every decode step (full KV kept; reads the top pages)";
  info.summary =
      "pages of `page` tokens with per-page key min/max; a decode step reads the pages with "
      "the highest logit bound, up to the budget, and always the newest page";
  info.paper =
      "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference (Tang et al., "
      "ICML 2024), arXiv 2406.10774";
  info.choices = {
      "GQA: a KV head reads the pages of the largest bound over its query heads; "
      "Quest's eval repeats KV so each query head picks its own pages",
      "only decode steps select pages: a one-token prefill (a context's last chunk, a "
      "one-token query) reads everything, where Quest's code (q_len > 1) would sparsify "
      "it",
      "the page holding the newest token is always read, whatever its bound (the query sees "
      "itself); Quest's evaluation code does not force it",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(int_param("page", 16, 1, 4096, "tokens per page"));
  info.params.push_back(
      int_param("dense_layers", 2, 0, kMaxTokens, "first layers that always read every page"));
  info.params.push_back(int_param("min_pages", 3, 1, kMaxTokens,
                                  "pages a step reads at least, whatever the budget (Quest: 3)"));
  info.check = [](const MethodParams& params) { check_budget(params); };
  info.make_reader = [](const MethodParams& params, const KvShape& shape) {
    QuestConfig config;
    config.budget = budget_from(params);
    config.page = static_cast<int32_t>(params.get_int("page"));
    config.dense_layers = static_cast<int32_t>(params.get_int("dense_layers"));
    config.min_pages = static_cast<int32_t>(params.get_int("min_pages"));
    return std::unique_ptr<ReadPolicy>(new QuestReader(config, shape));
  };
  return info;
}

}  // namespace kvbench
