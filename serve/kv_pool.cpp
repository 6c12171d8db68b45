#include "serve/kv_pool.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cache/registry.h"
#include "harness/model/llama_model.h"
#include "harness/model_cache.h"

namespace kvbench {

StoreCost KvPool::store_cost(const LlamaModel& model, const ResolvedSpec& spec) {
  std::string storage = "full";
  for (const auto& [info, params] : spec.components) {
    if (info->kind != MethodKind::Storage) continue;
    const std::string text = params.text();
    storage = text.empty() ? info->name : info->name + ":" + text;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto known = costs_.find(storage);
  if (known != costs_.end()) return known->second;
  constexpr int64_t kProbeTokens = 256;
  const KvShape shape = model.kv_shape();
  KvCache probe = new_cache(model, resolve_method_spec(storage));
  const int64_t width = static_cast<int64_t>(shape.n_kv_heads) * shape.head_dim;
  std::vector<float> k(kProbeTokens * width), v(kProbeTokens * width);
  for (size_t i = 0; i < k.size(); ++i) {  // values of a real cache's range; any would do
    k[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.f - 1.f;
    v[i] = static_cast<float>((i * 40503u) % 2001) / 1000.f - 1.f;
  }
  std::vector<int32_t> positions(2 * kProbeTokens);
  for (int64_t i = 0; i < 2 * kProbeTokens; ++i) positions[i] = static_cast<int32_t>(i);
  // The context, allocated once as the engine allocates a prompt.
  probe.reserve(kProbeTokens);
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    probe.append(l, k.data(), v.data(), positions.data(), kProbeTokens);
  }
  probe.advance(static_cast<int32_t>(kProbeTokens));
  StoreCost cost;
  cost.prefill_token_bytes = (probe.bytes_resident() + kProbeTokens - 1) / kProbeTokens;
  probe.end_context();
  const int64_t compressed = probe.bytes_resident();
  // Decodes the answer's 256 tokens into `cache`; returns the most bytes held per token of
  // any prefix of it (at least what the whole needed).
  const auto decode = [&](KvCache& cache, int64_t* most_bytes) {
    double rate = 0;
    *most_bytes = cache.bytes_resident();
    for (int64_t t = 0; t < kProbeTokens; ++t) {
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        cache.append(l, k.data() + t * width, v.data() + t * width,
                     positions.data() + kProbeTokens + t, 1);
      }
      cache.advance(1);
      *most_bytes = std::max(*most_bytes, cache.bytes_resident());
      rate = std::max(rate, static_cast<double>(cache.bytes_resident() - compressed) / (t + 1));
    }
    return static_cast<int64_t>(std::ceil(rate));
  };
  KvCache reserved = probe.clone();
  reserved.reserve_more(kProbeTokens);
  int64_t most_reserved = 0, most_grown = 0;
  decode(reserved, &most_reserved);
  cost.decode_token_bytes = decode(probe, &most_grown);
  cost.reserve_answer = most_reserved - compressed <=
                        std::max(most_grown - compressed, kProbeTokens * cost.decode_token_bytes);
  costs_[storage] = cost;
  return cost;
}

}  // namespace kvbench
