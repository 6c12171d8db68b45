// FastKV: token-selective propagation (TSP). The whole context runs through layers
// 0..tsp_layer; at tsp_layer the last `window` context queries score the prefix as SnapKV
// does (softmax attention summed over the window rows, causal inside the window, pooled
// along tokens, the GQA group's query heads together per KV head), the scores are summed over
// the KV heads, and the top floor(n * tsp_rate) tokens (the window among them) are the only
// ones whose hidden states go on through the later layers, at their own positions
// (LlamaModel::forward_propagating). So the later layers compute and store only those
// tokens: the prefill saves compute, which TTFT counts. At the end of the context every
// layer's KV is compressed to the budget SnapKV's way, per KV head, from that layer's own
// window: the early layers choose among the whole context, the later ones among the
// propagated tokens. Later tokens (queries, answers) are appended whole.
//
// Authors' settings (dongwonjo/FastKV b978769, baselines/fastkv/utils.py FastKVCluster and
// compress_fastkv, baselines/fastkv/llama_model.py, eval/run_longbench.py,
// scripts/eval_longbench.sh):
// - window 8, kernel 7, pooling maxpool; max_capacity_prompt 512 (constant mode) or
//   retain_rate 0.1 of the prompt (proportional mode, the script's); tsp_idx 15 (of
//   Llama-3.1-8B's 32 layers); tsp_rate 0.2 (proportional), tsp_len 2048 (constant).
// - Scores: the window's softmax rows summed over rows, pooled, then summed over the
//   group's query heads per KV head (GQA-aware: the cache stays per KV head); each layer
//   keeps the top (capacity - window) prefix tokens per KV head plus the window.
// - TSP at tsp_idx: the pooled per-KV-head scores summed over KV heads, top
//   (tsp_len - window) prefix tokens plus the window, sorted; the layer's output hidden
//   states of those rows and their position ids go on (llama_model.py gathers both).
// - Layers after tsp_idx keep retain_rate / tsp_rate of the propagated tokens, i.e. the
//   same number of tokens as the early layers (retain_rate of the whole prompt); a prompt
//   no longer than the capacity is neither compressed nor propagated selectively.
// Here: the budget is kvbench's (budget= tokens or ratio= of the context, window
// included), resolved against the whole context in every layer, as the authors' two modes
// both give; tsp_rate is the proportional mode's; tsp_layer defaults to the authors' depth
// scaled to the model (floor(15 * n_layers / 32)). kvbench's group scores are the mean over
// the group, where the authors sum: the same ranking. Ties go to the earlier token.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>

#include "common/input_error.h"
#include "methods/snapkv.h"

namespace kvbench {
namespace {

struct FastKvConfig {
  SnapKvConfig snap;       // budget, window, kernel, pool
  double tsp_rate = 0.2;   // share of the context that propagates past tsp_layer
  int32_t tsp_layer = 0;   // resolved for the model
};

// The authors' TSP depth, layer 15 of Llama-3.1-8B's 32, scaled to a model of n_layers.
int32_t default_tsp_layer(int32_t n_layers) { return n_layers * 15 / 32; }

// The length of the context a layer's store shows at ContextEnd: its last slot's position
// plus one (slots in position order before any eviction; the last token always propagates,
// so a later layer holding fewer tokens shows the same length).
int64_t context_length(const DenseKv& kv) {
  return kv.n_tokens == 0 ? 0 : static_cast<int64_t>(kv.positions[kv.n_tokens - 1]) + 1;
}

class FastKvPolicy : public TokenPolicy {
 public:
  FastKvPolicy(const FastKvConfig& config, int32_t n_layers)
      : config_(config),
        windows_(n_layers, QueryWindow(config.snap.window)),
        closed_(n_layers, false) {}

  std::unique_ptr<TokenPolicy> clone() const override {
    return std::make_unique<FastKvPolicy>(*this);
  }

  void observe(int32_t layer, const AttentionQuery& query, const DenseKv& kv) override {
    if (!closed_[layer]) windows_[layer].observe(query, kv.head_dim);
  }

  int32_t propagation_layer() const override { return config_.tsp_layer; }

  std::vector<int64_t> propagated_rows(int32_t layer, const DenseKv& kv) const override {
    const int64_t n = kv.n_tokens;
    std::vector<int64_t> rows(n);
    std::iota(rows.begin(), rows.end(), 0);
    const int64_t limit = config_.snap.budget.resolve(n);
    if (n <= limit) return rows;  // nothing to compress: everything propagates (authors)
    const int64_t window = std::min(config_.snap.window, limit);
    const int64_t count =
        std::max(window, static_cast<int64_t>(static_cast<double>(n) * config_.tsp_rate));
    if (count >= n) return rows;

    // Pooled prefix scores per KV head, summed over the KV heads.
    const std::vector<float> ranked = snapkv_ranking(windows_[layer].kv_head_scores(kv),
                                                     kv.n_kv_heads, n, window, config_.snap);
    const int64_t n_prefix = n - window;
    std::vector<double> total(n_prefix, 0.0);
    for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
      for (int64_t i = 0; i < n_prefix; ++i) total[i] += ranked[g * n + i];
    }
    std::vector<int64_t> prefix(n_prefix);
    std::iota(prefix.begin(), prefix.end(), 0);
    const int64_t keep = count - window;
    std::nth_element(prefix.begin(), prefix.begin() + keep, prefix.end(),
                     [&](int64_t a, int64_t b) {
                       return total[a] != total[b] ? total[a] > total[b] : a < b;
                     });
    prefix.resize(keep);
    std::sort(prefix.begin(), prefix.end());
    for (int64_t i = n_prefix; i < n; ++i) prefix.push_back(i);
    return prefix;
  }

  bool plan(int32_t layer, const DenseKv& kv, CachePhase phase, RetainPlan& plan) override {
    if (phase != CachePhase::ContextEnd || closed_[layer]) return false;
    // Whatever is decided, the window's queries are not needed afterwards.
    const QueryWindow held = std::move(windows_[layer]);
    windows_[layer] = QueryWindow();
    closed_[layer] = true;

    const int64_t n = kv.n_tokens;
    const int64_t limit = config_.snap.budget.resolve(context_length(kv));
    if (n <= limit) {
      if (n == context_length(kv)) return false;
      // A later layer the propagation left within its budget: planned as compressed all the
      // same (it keeps every slot), so its store grows by the eviction slack as a compressed
      // layer's does, not geometrically as a full cache's.
      std::vector<int32_t> all(n);
      std::iota(all.begin(), all.end(), 0);
      plan_same_slots(all, kv.n_kv_heads, plan);
      return true;
    }
    const int64_t window = std::min(config_.snap.window, limit);
    const std::vector<float> ranked =
        snapkv_ranking(held.kv_head_scores(kv), kv.n_kv_heads, n, window, config_.snap);
    plan_top_k_per_head(ranked.data(), kv.n_kv_heads, n, limit, plan);
    return true;
  }

  int64_t bytes_resident(int32_t layer) const override {
    return windows_[layer].bytes_resident();
  }
  bool done(int32_t layer) const override { return closed_[layer]; }

 private:
  FastKvConfig config_;
  std::vector<QueryWindow> windows_;  // each layer's last `window` context queries
  std::vector<bool> closed_;          // compressed at ContextEnd, for good
};

std::vector<ParamInfo> fastkv_params() {
  std::vector<ParamInfo> params = budget_params(kDefaultBudget);
  params.push_back(int_param("window", 8, 1, kMaxTokens,
                             "observation window: the last context queries that score the "
                             "prefix (and select the propagated tokens); always kept"));
  params.push_back(int_param("kernel", 7, 1, 1001, "pooling width along tokens, odd (1: none)"));
  params.push_back(
      choice_param("pool", "max", {"avg", "max"}, "pooling of the window's scores along tokens"));
  params.push_back(int_param("tsp_layer", -1, -1, kMaxTokens,
                             "the layer after which only the selected tokens go on; -1: the "
                             "authors' depth scaled to the model, floor(15 * n_layers / 32)"));
  ParamInfo rate = float_param("tsp_rate", "0.2", 0, 1,
                               "share of the context whose hidden states go on past tsp_layer "
                               "(window included)");
  rate.min_exclusive = true;
  params.push_back(rate);
  return params;
}

void check_fastkv_params(const MethodParams& params) {
  check_budget(params);
  check_window_in_budget(params);
  const int64_t kernel = params.get_int("kernel");
  if (kernel % 2 == 0) {
    throw InputError("kernel=" + std::to_string(kernel) +
                     " must be odd (the pooling window is centred on each token)");
  }
}

}  // namespace

// Registered as `fastkv` (methods/method_list.cpp).
MethodInfo fastkv_method() {
  MethodInfo info;
  info.name = "fastkv";
  info.kind = MethodKind::Eviction;
  info.stage =
      "prefill (token-selective propagation past tsp_layer) + 2: once, at the end of the "
      "shared context; later tokens are kept uncompressed";
  info.summary =
      "the whole context through the early layers, only the tokens the window's attention "
      "selects at tsp_layer through the later ones; every layer keeps SnapKV's top tokens "
      "per KV head plus the window";
  info.paper =
      "FastKV: KV Cache Compression for Fast Long-Context Processing with Token-Selective "
      "Propagation (Jo et al., 2025), arXiv 2502.01068";
  info.choices = {
      "budget is kvbench's (default 1024 tokens, or ratio= of the context), resolved against "
      "the whole context in every layer; the authors' constant mode keeps 512, their script "
      "retain_rate 0.1 (later layers: retain_rate / tsp_rate of the propagated tokens, the "
      "same count)",
      "tsp_rate is the authors' proportional mode (0.2); their constant mode's tsp_len 2048 "
      "is not offered",
      "tsp_layer defaults to the authors' depth (15 of 32 layers) scaled to the model: "
      "floor(15 * n_layers / 32), 11 of Qwen2.5-0.5B's 24",
      "GQA group scores are averaged per KV head where the authors sum them: the same ranking",
      "a context no longer than the budget is neither compressed nor propagated selectively, "
      "as the authors' update_kv returns early",
      "the CPU forward only (--device cuda is refused); its prefill is never shared with other "
      "methods (the later layers see fewer tokens)",
  };
  info.params = fastkv_params();
  info.check = check_fastkv_params;
  info.propagates_tokens = true;
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    FastKvConfig config;
    config.snap = snapkv_config_from(params);
    config.tsp_rate = params.get_float("tsp_rate");
    const int64_t layer = params.get_int("tsp_layer");
    if (layer >= shape.n_layers) {
      throw InputError("fastkv: tsp_layer=" + std::to_string(layer) + " is not a layer of this " +
                       std::to_string(shape.n_layers) + "-layer model (0.." +
                       std::to_string(shape.n_layers - 1) + ", or -1)");
    }
    config.tsp_layer =
        layer < 0 ? default_tsp_layer(shape.n_layers) : static_cast<int32_t>(layer);
    return std::unique_ptr<TokenPolicy>(new FastKvPolicy(config, shape.n_layers));
  };
  return info;
}

}  // namespace kvbench
