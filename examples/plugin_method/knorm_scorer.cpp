// Knorm through the scorer-only form: per KV head, the tokens whose keys have the lowest L2
// norm. The same selection as kvbench's built-in `knorm` (methods/knorm.cpp): kvbench's tests
// hold the two equal, kept tokens, logits and bytes.
#include "cache/scorer_method.h"
#include "kernels/cpu/scores.h"

namespace example {

kvbench::ScorerMethod knorm_scorer() {
  kvbench::ScorerMethod m;
  m.name = "example_knorm";
  m.summary = "keeps the keys with the lowest L2 norm, per KV head (a plugin)";
  m.paper = "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression "
            "(Devoto et al., EMNLP 2024), arXiv 2406.11430";
  m.params = {kvbench::int_param("skip", 2, 0, kvbench::kMaxTokens,
                                 "the first `skip` layers keep every token")};
  m.score = [](const kvbench::ScorerInput& in, float* scores) {
    if (in.layer < in.params->get_int("skip")) return false;  // the layer stays whole
    kvbench::key_norms_cpu(*in.kv, scores);
    const int64_t n = static_cast<int64_t>(in.kv->n_kv_heads) * in.kv->n_tokens;
    for (int64_t i = 0; i < n; ++i) scores[i] = -scores[i];  // lowest norm ranks first
    return true;
  };
  return m;
}

}  // namespace example
