#include "serve/kv_pool.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cache/registry.h"
#include "harness/model/llama_model.h"
#include "harness/model_cache.h"

namespace kvbench {

int64_t ByteBound::at(int64_t tokens) const {
  return fixed + static_cast<int64_t>(std::ceil(per_token * static_cast<double>(tokens)));
}

namespace {

// KV rows of a real cache's range (any values would do: bytes do not depend on them).
struct ProbeRows {
  std::vector<float> k, v;
  ProbeRows(int64_t tokens, int64_t width) : k(tokens * width), v(tokens * width) {
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<float>((i * 2654435761u) % 2001) / 1000.f - 1.f;
      v[i] = static_cast<float>((i * 40503u) % 2001) / 1000.f - 1.f;
    }
  }
};

// Feeds n tokens (rows [first, first + n) of `rows`) to every layer as one forward does.
void feed(KvCache& cache, const ProbeRows& rows, int64_t width, int64_t first, int64_t n) {
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = cache.next_position() + static_cast<int32_t>(i);
  for (int32_t l = 0; l < cache.shape().n_layers; ++l) {
    cache.append(l, rows.k.data() + first * width, rows.v.data() + first * width, positions.data(),
                 n);
  }
  cache.advance(static_cast<int32_t>(n));
}

// The line through the first and last points, lifted over every point: bytes[i] held
// after tokens[i] tokens.
ByteBound bound_of(const std::vector<int64_t>& tokens, const std::vector<int64_t>& bytes) {
  ByteBound bound;
  const size_t last = tokens.size() - 1;
  bound.per_token = std::max(0.0, static_cast<double>(bytes[last] - bytes[0]) /
                                      static_cast<double>(tokens[last] - tokens[0]));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const double over = static_cast<double>(bytes[i]) - bound.per_token * tokens[i];
    bound.fixed = std::max(bound.fixed, static_cast<int64_t>(std::ceil(over)));
  }
  return bound;
}

}  // namespace

StoreCost KvPool::store_cost(const LlamaModel& model, const ResolvedSpec& spec) {
  // The spec's storage component alone (the full cache's dense store without one): what a
  // sequence's bytes per token depend on, whatever evicts in front of it.
  ResolvedSpec store = full_cache_spec();
  for (const auto& component : spec.components) {
    if (component.first->kind != MethodKind::Storage) continue;
    store.canonical = component_text(*component.first, component.second);
    store.components = {component};
  }
  const std::string& storage = store.canonical;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto known = costs_.find(storage);
  if (known != costs_.end()) return known->second;
  const KvShape shape = model.kv_shape();
  const int64_t width = static_cast<int64_t>(shape.n_kv_heads) * shape.head_dim;
  StoreCost cost;

  // Whole sequences as the engine runs them where chunks settle: room reserved for all
  // their tokens, the prompt a chunk at a time, then the answer a token at a time. The
  // peak of each (KvCache's, taken before every settle) against its tokens.
  constexpr int64_t kAnswer = 64;
  if (new_cache(model, store).settle_context_chunks()) {
    cost.settles_chunks = true;
    const ProbeRows rows(prefill_chunk_ + kAnswer, width);
    std::vector<int64_t> tokens, peaks;
    std::vector<int64_t> answer_tokens(kAnswer + 1), grown(kAnswer + 1, 0);
    for (int64_t t = 0; t <= kAnswer; ++t) answer_tokens[t] = t;
    for (int64_t chunks : {2, 4, 8, 16}) {
      KvCache life = new_cache(model, store);
      life.settle_context_chunks();
      life.reserve(chunks * prefill_chunk_ + kAnswer);
      for (int64_t c = 0; c < chunks; ++c) feed(life, rows, width, 0, prefill_chunk_);
      life.end_context();
      const int64_t compressed = life.bytes_resident();
      for (int64_t t = 1; t <= kAnswer; ++t) {
        feed(life, rows, width, prefill_chunk_ + t - 1, 1);
        grown[t] = std::max(grown[t], life.bytes_resident() - compressed);
      }
      tokens.push_back(chunks * prefill_chunk_ + kAnswer);
      peaks.push_back(life.stats().bytes_peak);
    }
    cost.whole = bound_of(tokens, peaks);
    // Once the prompt is in, what the answer adds beyond it (its packed room was reserved:
    // the fp32 tail's comings and goings).
    cost.packed_answer = bound_of(answer_tokens, grown);
    // Room is reserved in whole packed blocks: a sequence's last ones may be more than the
    // line says by up to 64 tokens' worth.
    cost.whole.fixed += static_cast<int64_t>(std::ceil(cost.whole.per_token * 64));
  }

  // The context, allocated once as the engine allocates a prompt.
  constexpr int64_t kProbeTokens = 256;
  const ProbeRows rows(2 * kProbeTokens, width);
  KvCache probe = new_cache(model, store);
  probe.reserve(kProbeTokens);
  feed(probe, rows, width, 0, kProbeTokens);
  cost.prompt_token_bytes = std::ceil(static_cast<double>(probe.bytes_resident()) / kProbeTokens);
  probe.end_context();
  const int64_t compressed = probe.bytes_resident();
  // Decodes the answer's 256 tokens into `cache`; returns the bytes beyond `compressed`
  // after each.
  const auto decode = [&](KvCache& cache) {
    std::vector<int64_t> grown;
    for (int64_t t = 0; t < kProbeTokens; ++t) {
      feed(cache, rows, width, kProbeTokens + t, 1);
      grown.push_back(cache.bytes_resident() - compressed);
    }
    return grown;
  };
  std::vector<int64_t> tokens(kProbeTokens);
  for (int64_t t = 0; t < kProbeTokens; ++t) tokens[t] = t + 1;
  KvCache reserved = probe.clone();
  reserved.reserve_more(kProbeTokens);
  const std::vector<int64_t> up_front = decode(reserved);
  std::vector<int64_t> grown = decode(probe);
  // The line from the first token to the last, lifted: growth is 0 before the first.
  tokens.insert(tokens.begin(), 0);
  grown.insert(grown.begin(), 0);
  cost.answer = bound_of(tokens, grown);
  cost.reserve_answer =
      *std::max_element(up_front.begin(), up_front.end()) <= cost.answer.at(kProbeTokens);
  costs_[storage] = cost;
  return cost;
}

}  // namespace kvbench
