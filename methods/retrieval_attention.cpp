// RetrievalAttention (Liu et al., arXiv 2409.10516), as SCBench runs it (stage 3): the whole
// KV stays; a decode query of each layer reads a static window (the first `sink` and the
// newest `recent` tokens) and the `top_k` tokens of the rest that an approximate
// nearest-neighbour index over each KV head's keys returns for it. It saves reads, not memory.
//
// The index here is an IVF of kvbench's own (methods/ivf_index.h): `n_clusters` k-means
// centroids (L2, 10 rounds, seeded) per KV head over the keys outside the static window,
// built once when the context ends (KvCache::end_context, or the first decode step if none
// came). A query scores the centroids, scans the keys of its `nprobe` best clusters and keeps
// the top_k by q.k. Tokens that come later (decode tokens, later turns) sit in the recent
// window; as each leaves it, it is inserted into its nearest centroid's list (SCBench's
// VectorDB_KV_Cache.sync_key_update: the token pushed out of the GPU window goes to the CPU
// index); centroids are never retrained.
//
// Authors' settings (microsoft/MInference minference/modules/retr_attn.py, the SCBench
// implementation; models_patch.py):
// - static window: start_size 128, recent_size 512 (cache_size 640), every layer
//   (from_layer 0); top_k: retr_attn falls back to 2000, models_patch sets 4096.
// - index: papyfaiss FlatIndex (exact search) in the committed code; the IVF line left
//   commented is IVFIndexSQ n_centroids 512, nprobe 150 (SQ8). The paper's own index is an
//   attention-aware graph (RoarGraph, trained on query-key pairs); neither is in Debian.
// - each query head searches its KV head's index itself (search(q, num_key_value_groups)).
// Here (choices in the registration):
// - GQA: one selection per KV head (kvbench's reads are per KV head): the group's query heads
//   each probe their nprobe best clusters, the union is scanned, and candidates rank by the
//   largest q.k over the group.
// - when the probed lists hold fewer than top_k keys, further clusters (by the group's best
//   centroid score) are scanned until they do, so every step reads top_k keys.
// - a step whose static window plus top_k covers every token reads everything (the dense
//   result, bit for bit).
// - the index keeps its own fp32 copy of the keys (as IVF-Flat lists hold their vectors),
//   counted in bytes_resident with the centroids and list slots; a step's bytes_read counts
//   the centroids and the probed keys (and their slots) it scanned.
// - recall (ReadPolicy::recall): per decode query head, |read ∩ exact top_k by q.k| / top_k
//   over the indexed tokens (the static window is read anyway); a step reading everything
//   counts 1. The exact top_k is measured beside the run, not counted as read.
#include <algorithm>
#include <cassert>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cache/plan_helpers.h"
#include "cache/read_policy.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "methods/ivf_index.h"

namespace kvbench {

namespace {

constexpr int32_t kKmeansRounds = 10;
constexpr uint64_t kKmeansSeed = 2409105160ULL;

struct RetrievalConfig {
  int64_t top_k = 2000;
  int32_t nprobe = 150;
  int32_t n_clusters = 512;
  int64_t sink = 128;
  int64_t recent = 512;
};

float dot(const float* a, const float* b, int32_t dim) {
  float s = 0.f;
  for (int32_t i = 0; i < dim; ++i) s += a[i] * b[i];
  return s;
}

// (score, slot): higher score first, ties to the older slot.
struct Scored {
  float score;
  int32_t slot;
};
bool ranks_before(const Scored& a, const Scored& b) {
  return a.score > b.score || (a.score == b.score && a.slot < b.slot);
}

class RetrievalReader : public ReadPolicy {
 public:
  RetrievalReader(const RetrievalConfig& config, const KvShape& shape)
      : config_(config), shape_(shape), layers_(static_cast<size_t>(shape.n_layers)) {
    for (LayerIndex& layer : layers_) layer.heads.resize(static_cast<size_t>(shape.n_kv_heads));
  }

  std::unique_ptr<ReadPolicy> clone() const override {
    return std::make_unique<RetrievalReader>(*this);
  }

  void appended(int32_t layer, const float* k, int64_t first_slot, int64_t n_new) override {
    LayerIndex& index = layers_[layer];
    // Slots rewritten below the indexed end (never for a full cache): the index is rebuilt
    // when next needed; the keys before first_slot stay.
    if (index.built && first_slot < index.indexed_end) {
      for (HeadIndex& head : index.heads) head.ivf = IvfIndex();
      index.built = false;
      index.indexed_end = 0;
    }
    const int32_t d = shape_.head_dim;
    for (int32_t h = 0; h < shape_.n_kv_heads; ++h) {
      std::vector<float>& keys = index.heads[h].keys;
      const size_t need = static_cast<size_t>((first_slot + n_new) * d);
      // Room for 1/8 more at a time (a decode token a step), not the vector's doubling.
      if (need > keys.capacity()) keys.reserve(need + need / 8);
      keys.resize(need);
      for (int64_t t = 0; t < n_new; ++t) {
        std::copy_n(k + (t * shape_.n_kv_heads + h) * d, d, keys.begin() + (first_slot + t) * d);
      }
    }
    index.n_tokens = first_slot + n_new;
  }

  void context_ended() override {
    for (size_t l = 0; l < layers_.size(); ++l) catch_up(layers_[l], layers_[l].n_tokens);
  }

  const PageSelection* select(int32_t layer, const AttentionQuery& query, int64_t n_tokens,
                              int64_t* bytes_read) override {
    assert(query.n_queries == 1);  // a decode step
    LayerIndex& index = layers_[layer];
    assert(n_tokens == index.n_tokens);
    catch_up(index, n_tokens);
    const int64_t n_select = config_.sink + config_.top_k + config_.recent;
    if (n_select >= n_tokens) {
      recall_.sum += query.n_heads;
      recall_.count += query.n_heads;
      return nullptr;
    }
    selected_.resize(static_cast<size_t>(shape_.n_kv_heads * n_select));
    for (int32_t h = 0; h < shape_.n_kv_heads; ++h) {
      int32_t* out = selected_.data() + h * n_select;
      for (int64_t t = 0; t < config_.sink; ++t) *out++ = static_cast<int32_t>(t);
      *bytes_read += retrieve(index, h, query, out);
      out += config_.top_k;
      for (int64_t t = n_tokens - config_.recent; t < n_tokens; ++t)
        *out++ = static_cast<int32_t>(t);
    }
    selection_ = PageSelection{selected_.data(), static_cast<int32_t>(n_select), 1};
    return &selection_;
  }

  int64_t bytes_resident(int32_t layer) const override {
    int64_t bytes = 0;
    for (const HeadIndex& head : layers_[layer].heads) {
      bytes += vector_bytes(head.keys) + head.ivf.bytes();
    }
    return bytes;
  }

  Recall recall() const override { return recall_; }

 private:
  struct HeadIndex {
    std::vector<float> keys;  // [slots, head_dim]: every slot's key, the index's vectors
    IvfIndex ivf;
  };
  struct LayerIndex {
    std::vector<HeadIndex> heads;
    int64_t n_tokens = 0;  // slots appended
    bool built = false;
    int64_t indexed_end = 0;  // slots [sink, indexed_end) are in the index
  };

  // Brings the index up to the slots left of the recent window: built at the first call
  // (once there is a slot to index), then each slot leaving the window inserted.
  void catch_up(LayerIndex& index, int64_t n_tokens) const {
    const int64_t end = n_tokens - config_.recent;
    if (end <= config_.sink || (index.built && end <= index.indexed_end)) return;
    const int32_t d = shape_.head_dim;
    for (HeadIndex& head : index.heads) {
      if (!index.built) {
        head.ivf.build(head.keys.data() + config_.sink * d, d, config_.sink, end - config_.sink,
                       config_.n_clusters, kKmeansRounds, kKmeansSeed);
      } else {
        for (int64_t t = index.indexed_end; t < end; ++t)
          head.ivf.insert(head.keys.data() + t * d, t);
      }
    }
    index.built = true;
    index.indexed_end = end;
  }

  // Writes KV head h's top_k slots (ascending) to out; returns the bytes scanned (centroids,
  // probed keys and their slots). Adds the group's recall.
  int64_t retrieve(const LayerIndex& index, int32_t h, const AttentionQuery& query, int32_t* out) {
    const HeadIndex& head = index.heads[h];
    const IvfIndex& ivf = head.ivf;
    const int32_t d = shape_.head_dim;
    const int32_t group = query.n_heads / shape_.n_kv_heads;
    const float* q0 = query.q + static_cast<int64_t>(h) * group * d;
    const int32_t n_clusters = ivf.n_clusters();
    // Each query head's nprobe best clusters, and the group's best score per cluster.
    std::vector<Scored> by_cluster(static_cast<size_t>(n_clusters));
    std::vector<float> best(static_cast<size_t>(n_clusters),
                            -std::numeric_limits<float>::infinity());
    std::vector<uint8_t> probed(static_cast<size_t>(n_clusters), 0);
    const int32_t nprobe = std::min(config_.nprobe, n_clusters);
    for (int32_t g = 0; g < group; ++g) {
      for (int32_t c = 0; c < n_clusters; ++c) {
        by_cluster[c] = Scored{dot(q0 + g * d, ivf.centroid(c), d), c};
        best[c] = std::max(best[c], by_cluster[c].score);
      }
      std::partial_sort(by_cluster.begin(), by_cluster.begin() + nprobe, by_cluster.end(),
                        ranks_before);
      for (int32_t i = 0; i < nprobe; ++i) probed[by_cluster[i].slot] = 1;
    }
    int64_t n_candidates = 0;
    for (int32_t c = 0; c < n_clusters; ++c) {
      if (probed[c]) n_candidates += static_cast<int64_t>(ivf.list(c).size());
    }
    if (n_candidates < config_.top_k) {  // too few keys probed: the next clusters by score
      for (int32_t c = 0; c < n_clusters; ++c) by_cluster[c] = Scored{best[c], c};
      std::sort(by_cluster.begin(), by_cluster.end(), ranks_before);
      for (int32_t i = 0; i < n_clusters && n_candidates < config_.top_k; ++i) {
        const int32_t c = by_cluster[i].slot;
        if (probed[c]) continue;
        probed[c] = 1;
        n_candidates += static_cast<int64_t>(ivf.list(c).size());
      }
    }
    candidates_.clear();
    for (int32_t c = 0; c < n_clusters; ++c) {
      if (!probed[c]) continue;
      for (int32_t slot : ivf.list(c)) {
        const float* key = head.keys.data() + static_cast<int64_t>(slot) * d;
        float score = dot(q0, key, d);
        for (int32_t g = 1; g < group; ++g) score = std::max(score, dot(q0 + g * d, key, d));
        candidates_.push_back(Scored{score, slot});
      }
    }
    assert(static_cast<int64_t>(candidates_.size()) >= config_.top_k);
    std::nth_element(candidates_.begin(), candidates_.begin() + config_.top_k, candidates_.end(),
                     ranks_before);
    for (int64_t i = 0; i < config_.top_k; ++i) out[i] = candidates_[i].slot;
    std::sort(out, out + config_.top_k);
    add_recall(index, h, q0, group, out);
    return static_cast<int64_t>(n_clusters) * d * static_cast<int64_t>(sizeof(float)) +
           n_candidates *
               (d * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(int32_t)));
  }

  // For each query head of the group: the share of its exact top_k indexed keys (by q.k)
  // among `picked` (top_k slots, ascending).
  void add_recall(const LayerIndex& index, int32_t h, const float* q0, int32_t group,
                  const int32_t* picked) {
    const HeadIndex& head = index.heads[h];
    const int32_t d = shape_.head_dim;
    exact_.resize(static_cast<size_t>(index.indexed_end - config_.sink));
    for (int32_t g = 0; g < group; ++g) {
      for (int64_t t = config_.sink; t < index.indexed_end; ++t) {
        exact_[t - config_.sink] =
            Scored{dot(q0 + g * d, head.keys.data() + t * d, d), static_cast<int32_t>(t)};
      }
      std::nth_element(exact_.begin(), exact_.begin() + config_.top_k, exact_.end(), ranks_before);
      int64_t hits = 0;
      for (int64_t i = 0; i < config_.top_k; ++i) {
        hits += std::binary_search(picked, picked + config_.top_k, exact_[i].slot) ? 1 : 0;
      }
      recall_.sum += static_cast<double>(hits) / static_cast<double>(config_.top_k);
      recall_.count += 1;
    }
  }

  RetrievalConfig config_;
  KvShape shape_;
  std::vector<LayerIndex> layers_;
  Recall recall_;
  // Scratch of the last selection (select's result points into it).
  std::vector<int32_t> selected_;
  std::vector<Scored> candidates_, exact_;
  PageSelection selection_{};
};

}  // namespace

// Registered as `retrieval_attention` (methods/method_list.cpp).
MethodInfo retrieval_attention_method() {
  MethodInfo info;
  info.name = "retrieval_attention";
  info.kind = MethodKind::Retrieval;
  info.stage =
      "3: every decode step (full KV kept; an IVF index per KV head, built at the "
      "context's end, picks the keys read)";
  info.summary =
      "a decode query reads the first `sink` and newest `recent` tokens and the `top_k` keys "
      "an IVF index (k-means, `n_clusters`, `nprobe` probed) over each KV head's other keys "
      "returns; tokens leaving the recent window join the index";
  info.paper =
      "RetrievalAttention: Accelerating Long-Context LLM Inference via Vector Retrieval (Liu "
      "et al., 2024), arXiv 2409.10516; as run by SCBench (MInference retr_attn.py)";
  info.choices = {
      "index: an IVF of kvbench's own (k-means, L2, 10 rounds, fixed seed) where the paper "
      "uses an attention-aware graph (RoarGraph) and SCBench's code an exact flat index; "
      "nprobe=n_clusters makes it exact",
      "GQA: one selection per KV head: each query head probes its nprobe best clusters, the "
      "union is scanned, candidates rank by the largest q.k over the group (SCBench searches "
      "per query head)",
      "when the probed lists hold fewer than top_k keys, further clusters (by the group's "
      "best centroid score) are scanned until they do",
      "the index is built once, at the context's end; centroids are not retrained as tokens "
      "leaving the recent window are inserted",
      "the index holds its own fp32 copy of the keys (counted in bytes_resident); bytes_read "
      "counts the centroids and the probed keys a step scanned",
      "defaults: SCBench's window (128 + 512), retr_attn's top_k fallback 2000, the commented "
      "IVF's 512 centroids and nprobe 150",
  };
  info.params.push_back(int_param("top_k", 2000, 1, kMaxTokens,
                                  "keys a query reads from the index (beside the window)"));
  info.params.push_back(int_param("nprobe", 150, 1, 1 << 20, "clusters each query head scans"));
  info.params.push_back(int_param("n_clusters", 512, 1, 1 << 20,
                                  "k-means centroids per KV head (at most the indexed tokens)"));
  info.params.push_back(int_param("sink", 128, 0, kMaxTokens, "first tokens always read"));
  info.params.push_back(
      int_param("recent", 512, 1, kMaxTokens, "newest tokens always read (the query's own too)"));
  info.check = [](const MethodParams& params) {
    const int64_t nprobe = params.get_int("nprobe"), n_clusters = params.get_int("n_clusters");
    if (nprobe > n_clusters) {
      throw InputError("retrieval_attention: nprobe=" + std::to_string(nprobe) +
                       " exceeds n_clusters=" + std::to_string(n_clusters));
    }
  };
  info.make_reader = [](const MethodParams& params, const KvShape& shape) {
    RetrievalConfig config;
    config.top_k = params.get_int("top_k");
    config.nprobe = static_cast<int32_t>(params.get_int("nprobe"));
    config.n_clusters = static_cast<int32_t>(params.get_int("n_clusters"));
    config.sink = params.get_int("sink");
    config.recent = params.get_int("recent");
    return std::unique_ptr<ReadPolicy>(new RetrievalReader(config, shape));
  };
  return info;
}

}  // namespace kvbench
