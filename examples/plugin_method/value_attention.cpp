// A method kvbench does not have: VATP's token importance (Guo et al., "Attention Score is not
// All You Need for Token Importance Indicator in KV Cache Reduction: Value Also Matters",
// EMNLP 2024, arXiv 2406.12335), the attention a token receives times the L1 norm of its value.
// VATP accumulates the attention over every query, as H2O does; this plugin takes it from
// SnapKV's observation window at the end of the context, and keeps the attention sinks whole
// (VATP's authors note their values are small while their attention is large).
#include <cmath>

#include "cache/scorer_method.h"

namespace example {

kvbench::ScorerMethod value_attention() {
  kvbench::ScorerMethod m;
  m.name = "value_attention";
  m.summary = "the observation window's attention times the value's L1 norm, per KV head "
              "(VATP's importance; a plugin)";
  m.paper = "Attention Score is not All You Need for Token Importance Indicator in KV Cache "
            "Reduction: Value Also Matters (Guo et al., EMNLP 2024), arXiv 2406.12335";
  m.choices = {"attention from the last `window` context queries, not summed over every "
               "query as VATP does"};
  m.window = 32;
  m.window_attention = true;
  m.score = [](const kvbench::ScorerInput& in, float* scores) {
    const kvbench::DenseKv& kv = *in.kv;
    for (int32_t h = 0; h < kv.n_kv_heads; ++h) {
      for (int64_t t = 0; t < kv.n_tokens; ++t) {
        const float* v = kv.value(h, t);  // rows `capacity` apart: kv.value says where
        float l1 = 0.f;
        for (int32_t d = 0; d < kv.head_dim; ++d) l1 += std::fabs(v[d]);
        const int64_t i = h * kv.n_tokens + t;
        scores[i] = in.window_attention[i] * l1;
      }
    }
    return true;
  };
  return m;
}

}  // namespace example
