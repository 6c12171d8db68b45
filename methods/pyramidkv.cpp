// PyramidKV: SnapKV's selection (methods/snapkv.h) with layer budgets that decrease with
// depth, lower layers keeping more ("pyramidal information funneling"); `budget` is the
// average per layer.
//
// The layer budgets follow KVCache-Factory's PyramidKVCluster.update_kv exactly (integer
// arithmetic), not kvpress's float variant that always applies the ratio. Its runs override
// every SnapKV-family method to window 8, max-pool 7; the defaults here are SCBench's
// (window 32, avg-pool 5), shared with snapkv.
#include <string>

#include "common/input_error.h"
#include "methods/snapkv.h"

namespace kvbench {
namespace {

// Prefix tokens layer `layer` of `n_layers` keeps of a context of n_context tokens, for a
// budget and window (window <= budget < n_context). With A = budget - window:
// min = A / beta, max = 2A - min, clamped so layer 0 keeps at most the whole prefix; the
// layers step down evenly from max; a context shorter than 2A keeps A in every layer.
int64_t pyramid_prefix_keep(int32_t layer, int32_t n_layers, int64_t beta, int64_t n_context,
                            int64_t budget, int64_t window) {
  const int64_t average = budget - window;
  if (n_context < 2 * average) return average;
  int64_t min_num = average / beta;
  int64_t max_num = 2 * average - min_num;
  if (max_num >= n_context - window) {
    max_num = n_context - window;
    min_num = 2 * average - max_num;
  }
  const int64_t step = n_layers > 1 ? (max_num - min_num) / (n_layers - 1) : 0;
  return max_num - layer * step;
}

}  // namespace

// Registered as `pyramidkv` (methods/method_list.cpp).
MethodInfo pyramidkv_method() {
  MethodInfo info;
  info.name = "pyramidkv";
  info.kind = MethodKind::Eviction;
  info.stage = "2: once, at the end of the shared context; later tokens are kept uncompressed";
  info.summary =
      "SnapKV's selection with per-layer budgets decreasing linearly with depth, averaging "
      "`budget`";
  info.paper =
      "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling "
      "(Cai et al.), arXiv 2406.02069";
  info.choices = {
      "GQA: the group's query-head scores are averaged per KV head before pooling, as "
      "kvpress does; the authors' code selects per query head over repeated KV",
      "layer budgets by KVCache-Factory's integer formula; defaults are SCBench's "
      "(window 32, avg-pool 5), where KVCache-Factory runs window 8, max-pool 7",
      "that formula floors the step between layers, so the layers' mean runs over `budget`: "
      "72 tokens a layer at budget=64 on Qwen2.5-Coder-0.5B (24 layers), 66 on SmolLM2 "
      "(the bytes reported are the ones held); kvpress's float variant holds the mean but "
      "falls back to a uniform split whenever (budget - window) / beta < window",
  };
  info.params = snapkv_params();
  const ParamInfo beta =
      int_param("beta", 20, 1, kNoMax,
                "the deepest layer keeps about (budget - window) / beta prefix tokens");
  info.params.push_back(beta);
  info.check = check_snapkv_params;
  info.make_allocated_policy = [](const MethodParams& params, const KvShape& shape,
                                  std::shared_ptr<const HeadAllocation> allocation) {
    const int32_t n_layers = shape.n_layers;
    const int64_t beta = params.get_int("beta");
    PrefixKeep prefix_keep = [n_layers, beta](int32_t layer, int64_t n_context, int64_t budget,
                                              int64_t window) {
      return pyramid_prefix_keep(layer, n_layers, beta, n_context, budget, window);
    };
    return std::unique_ptr<TokenPolicy>(new SnapKvPolicy(
        snapkv_config_from(params), n_layers, std::move(prefix_keep), std::move(allocation)));
  };
  info.make_policy = [make = info.make_allocated_policy](const MethodParams& params,
                                                         const KvShape& shape) {
    return make(params, shape, nullptr);
  };
  return info;
}

}  // namespace kvbench
