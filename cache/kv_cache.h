// The KV-store interface: attention reads keys and values only through it, so a cache
// method (eviction, quantization, retrieval, ...) changes what attention sees.
//
// Three parts, so that a method plans and the store applies (docs/overview.md):
//   LayerKv     one layer's physical storage (fp32, or KIVI's packed form): appends,
//               attends, applies retain plans and really frees what it drops;
//   TokenPolicy (cache/policy.h) an eviction or merging method's decisions: plans what
//               each layer keeps;
//   ReadPolicy  (cache/read_policy.h) a retrieval method's decisions: picks what each
//               decode query reads.
// KvCache ties them together for one sequence; the model calls only KvCache. Methods
// compose by filling different parts (snapkv plans what a KIVI store keeps and packs).
// Framework-free: raw pointers in the layouts of kernels/layouts.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/policy.h"
#include "cache/read_policy.h"
#include "kernels/layouts.h"

namespace kvbench {

class PrefillAttention;  // cache/prefill_attention.h

// Shape of one sequence's cache.
struct KvShape {
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  // The model's RoPE, for a store that holds keys as they were before it (kvquant_keys
  // turns the keys it is handed back by their positions): the frequency of each pair
  // (2i, 2i + 1), as ModelConfig::rope_inv_freq. Empty where no model gave it.
  std::vector<float> rope_inv_freq = {};  // [head_dim / 2]
  // How much each KV head retrieves from far back in the context, for a method that keeps
  // whole heads (duo_attention): the attention its query heads pay to a needle in a probe of
  // the model (harness/head_probe.h), higher more retrieval-like. Empty where no probe ran.
  std::vector<float> head_retrieval = {};  // [n_layers * n_kv_heads]
  int32_t n_heads = 0;  // query heads, n_kv_heads times the GQA group; 0 where no model gave it
  // The model's output projection seen from each query head h: G_h = W_o_h^T W_o_h, where
  // W_o_h is the head_dim columns of W_o that h's output goes through, so a value v of h's
  // KV head moves the layer's output by ||W_o_h v|| = sqrt(v^T G_h v) (CriticalKV weighs
  // tokens by it). [n_layers, n_heads, head_dim, head_dim]; shared, as every cache copies its
  // shape. Null where no model gave it.
  std::shared_ptr<const std::vector<float>> value_out_gram = nullptr;
};

// Bytes a cache holds in one storage tier: "ram" (host memory) or "device" (GPU memory).
struct TierBytes {
  std::string tier;
  int64_t bytes = 0;
};

// What a cache holds and did, measured from its storage: the one way a method reports
// itself. Counters (evicted, hits, misses, bytes_moved) run from the cache's creation.
struct CacheStats {
  // Tokens held per layer, per KV head: where the heads of a layer hold different counts
  // (head-wise budgets, cache/allocation.h) their mean, rounded up.
  std::vector<int64_t> tokens_per_layer;
  std::vector<int64_t> tokens_per_head;  // [n_layers, n_kv_heads] tokens each KV head holds
  std::vector<int64_t> bytes_per_layer;  // bytes held per layer: KV, positions, policy scores
  std::vector<TierBytes> tiers;          // bytes resident per tier; they sum to bytes_resident
  int64_t bytes_resident = 0;            // sum of bytes_per_layer
  int64_t bytes_peak = 0;                // largest bytes_resident since creation / reset_peak
  int64_t tokens_seen = 0;               // tokens fed to the model (the next position)
  int64_t tokens_evicted = 0;            // slots freed, summed over layers
  int64_t hits = 0;                      // reuse lookups served from a store (stage 4)
  int64_t misses = 0;                    // reuse lookups that had to prefill
  int64_t bytes_moved = 0;               // bytes copied between tiers
  // KV bytes attention read in the last forward, all layers (what decode streams from
  // memory: Quest reads its page bounds and the pages chosen, KIVI its packed blocks),
  // and summed since creation.
  int64_t bytes_read_last_forward = 0;
  int64_t bytes_read_total = 0;
};

// Sees the KV the model hands the cache, before any store transforms it (prefix reuse
// records blocks of it for later requests).
class KvTap {
 public:
  virtual ~KvTap() = default;
  // k, v: [n, n_kv_heads, head_dim] as LayerKv::append receives them.
  virtual void appended(int32_t layer, const float* k, const float* v, const int32_t* positions,
                        int64_t n) = 0;
};

// One layer of one sequence.
class LayerKv {
 public:
  virtual ~LayerKv() = default;
  // Makes room for n_tokens in total, so a known-length prompt allocates once.
  virtual void reserve(int64_t n_tokens) = 0;
  // Stores new tokens. k, v: [n_new, n_kv_heads, head_dim] (projection output, RoPE applied
  // to k); positions: [n_new].
  virtual void append(const float* k, const float* v, const int32_t* positions, int64_t n_new) = 0;
  // Causal attention of a chunk's queries over what is stored (the chunk itself included),
  // or only over the selected pages (nullptr: all). Returns the bytes of storage it read.
  virtual int64_t attend(const AttentionQuery& query, const PageSelection* pages) const = 0;
  // attend over every stored token that also ADDS the softmax attention each stored token
  // receives, summed over the query rows, into scores [query.n_heads, n_tokens()] (what
  // attention_scores_cpu adds over view()), for a policy scored that way
  // (TokenPolicy::ScoredRows::All): in one pass where the store can, returning the bytes read;
  // -1, having done nothing, where it cannot.
  virtual int64_t attend_scored(const AttentionQuery& /*query*/, float* /*scores*/) const {
    return -1;
  }
  // Keeps only the planned slots and frees storage the drop makes idle. Slots may move:
  // on return plan.slots[h * n_keep + j] is the old slot now at slot j, always >= j (a
  // dropped slot's hole is filled from the tail, so one decode-step eviction moves one
  // token, not all those after it). Positions travel with their tokens.
  virtual void retain(RetainPlan& plan) = 0;
  // The stored KV in fp32, for policies to score (a packed store unpacks into a buffer it
  // holds until settle()). A layer whose heads hold their own counts shows its shape alone.
  virtual DenseKv view() const = 0;
  // view(), except in a layer whose heads hold their own counts (holds_ragged_heads, after a
  // ragged plan), where it is those heads gathered into one view with DenseKv::head_tokens
  // (cache/ragged_view.h; a copy, held until settle()): for a policy that reads such layers
  // (TokenPolicy::reads_ragged_heads).
  virtual DenseKv heads_view() const { return view(); }
  // The end of a forward, after the policy's plan: a store that packs what it holds (KIVI
  // quantizes full blocks past its fp32 residual) does it here.
  virtual void settle() {}
  // Asks the store to settle after every chunk of the context too
  // (KvCache::settle_context_chunks); returns whether it can: its settle() packs only what
  // later tokens cannot change (KIVI's whole blocks). From then on reserve(n) makes room for
  // n tokens as the store packs them, not for n at fp32 before the context's end.
  virtual bool settle_each_chunk() { return false; }
  virtual std::unique_ptr<LayerKv> clone() const = 0;
  // Tokens the policy sees and plans over (view()).
  virtual int64_t n_tokens() const = 0;
  // Tokens attention reads: n_tokens, or more where the store keeps what a plan drops at
  // lower precision (MiKV) instead of freeing it.
  virtual int64_t n_tokens_held() const { return n_tokens(); }
  // Tokens KV head `head` holds: n_tokens_held() in every head, except in a store whose heads
  // hold their own counts after a ragged plan (RetainPlan::head_keep), where n_tokens() is
  // the largest of them.
  virtual int64_t head_tokens(int32_t /*head*/) const { return n_tokens_held(); }
  // Whether retain applies ragged plans (RetainPlan::head_keep): the dense fp32 store does,
  // and any store that gives head_store (cache/head_split.h).
  virtual bool holds_ragged_heads() const { return false; }
  // KV head `head` alone, in a one-head store of this kind holding exactly what this one
  // holds for it (codes, scales, positions; nothing rounded again), or nullptr where the
  // store cannot split its heads. A layer splits on its first ragged plan (HeadSplitLayerKv).
  virtual std::unique_ptr<LayerKv> head_store(int32_t /*head*/) const { return nullptr; }
  virtual int64_t bytes_resident() const = 0;  // bytes this layer's storage really holds
  // The memory tier those bytes live in: "ram" (host memory) or "device" (GPU memory).
  virtual const char* tier() const { return "ram"; }
  // Sees every forward's queries right after they attended (KvCache::attend), for a store
  // that picks its own layout from them (ThinK keeps the context's last queries to choose
  // the key channels it stores). Most stores ignore them.
  virtual void observe_queries(const AttentionQuery& /*query*/) {}
};

// The cache of one sequence: a store per layer, the method's policy (none for the full
// cache) and the next position to fill.
class KvCache {
 public:
  KvCache(KvShape shape, std::vector<std::unique_ptr<LayerKv>> layers,
          std::unique_ptr<TokenPolicy> policy = nullptr,
          std::unique_ptr<ReadPolicy> reader = nullptr);
  KvCache(KvCache&&) noexcept;
  KvCache& operator=(KvCache&&) noexcept;
  ~KvCache();

  const KvShape& shape() const { return shape_; }
  const LayerKv& layer(int32_t i) const { return *layers_[i]; }
  const TokenPolicy* policy() const { return policy_.get(); }
  const ReadPolicy* reader() const { return reader_.get(); }

  // The forward pass, layer by layer: store the chunk's K/V, then attend over the store
  // (the policy sees the queries afterwards, for attention-based scores).
  void append(int32_t layer, const float* k, const float* v, const int32_t* positions,
              int64_t n_new);
  void attend(int32_t layer, const AttentionQuery& query);
  // End of a forward over n_tokens: positions move on, the policy may evict
  // (CachePhase::ContextChunk before end_context, CachePhase::AfterContext after it) and
  // the stores settle. While the context is still coming in, stores wait for end_context
  // to settle: the context attends over itself in fp32, as KIVI's prefill does, and a
  // policy decides on fp32 KV before the store packs what it kept (evict, then quantize).
  void advance(int32_t n_tokens);
  // The next forward is one decode step (a token the model generated, or a teacher-forced
  // answer token): only its queries read what a retrieval method (Quest) selects. Prefill
  // of any length, a one-token query or chunk included, reads everything. advance() ends it.
  void mark_decode_step() { decode_step_ = true; }
  // The next forward feeds n_tokens (in chunks): a sparse prefill's pattern knows where the
  // prompt ends (Tri-shape's dense last rows).
  void begin_forward(int64_t n_tokens) { forward_end_ = next_position_ + n_tokens; }
  // Every prefill forward's attention runs through a Prefill method (a_shape, tri_shape,
  // minference: reading only the keys of its pattern; nullptr: dense). Decode steps stay dense.
  void set_prefill_attention(std::shared_ptr<const PrefillAttention> prefill) {
    prefill_ = std::move(prefill);
  }
  // Attention FLOPs of sparse prefills since creation (4 * head_dim per query-key pair per
  // query head): computed, and what dense causal attention of the same rows computes. 0
  // without a sparse prefill (not measured).
  double attn_flops() const { return attn_flops_; }
  double attn_flops_dense() const { return attn_flops_dense_; }
  // The shared context is all in: the policy compresses it (CachePhase::ContextEnd).
  void end_context();
  bool context_ended() const { return context_ended_; }
  // Stores settle after every chunk of the context too, not only at its end: each later
  // chunk attends over what the earlier ones packed, and a long prompt is never held whole
  // at fp32 (a serving engine's quantized cache: serve/engine.h). Only where nothing plans
  // on the context's fp32 KV (no policy) and every store settles by blocks; returns whether
  // it took effect. Call on an empty cache; clones keep it.
  bool settle_context_chunks();

  // Position of the next token fed to the model (tokens seen so far, evicted or not).
  int32_t next_position() const { return next_position_; }
  void reserve(int64_t n_tokens);
  // Room for n more tokens in every layer beyond what that layer stores now: layers that
  // keep different numbers of tokens (Knorm's and PyramidKV's) are not all grown to the
  // largest one.
  void reserve_more(int64_t n_tokens);
  // The same in layers [first, end) alone: the later layers of a prefill that propagates
  // only some tokens past a layer (LlamaModel::forward_propagating) hold fewer.
  void reserve_more(int64_t n_tokens, int32_t first, int32_t end);

  // KVzip's scoring forward (harness/reconstruction.h), which is not part of the sequence:
  // scoring_copy is a clone whose policy is told that the forward fed next repeats context
  // positions [begin, end) (TokenPolicy::reconstructing); adopt_scoring takes back its
  // policy, which observed that forward, and its peak (the prompt's KV was really held).
  KvCache scoring_copy(int64_t begin, int64_t end) const;
  void adopt_scoring(KvCache&& scratch);
  // Takes the reconstruction scores of another cache of the same contents
  // (TokenPolicy::adopt_scores), with the peak that cache reached scoring (`scored_peak`):
  // what the forwards would have left here. False (nothing changed) when the policy cannot.
  bool adopt_scores(const TokenPolicy& scored, int64_t scored_peak);

  // Shows the policy the context's tokens as text (TokenPolicy::context_text).
  void show_context_text(const std::vector<std::string>& token_texts) {
    if (policy_) policy_->context_text(token_texts);
  }

  // Every later append is shown to `tap` first (nullptr: none). Not copied by clone().
  void set_tap(KvTap* tap) { tap_ = tap; }

  // A deep copy (storage, policy state, counters): a branch that can decode and be dropped.
  KvCache clone() const;

  // Starts this empty cache from a prefill another cache ran (harness/shared_prefill.h):
  // `source` holds the context in fp32 with nothing evicted, its context not yet ended. Its
  // KV is appended here as a forward appends it (`chunk` rows at a time, so stores and a
  // reader grow as they would), positions move on, and the prefill's read counters and
  // peak are taken over. With a policy that observed the same queries, this is the cache
  // a prefill of its own would have left. `observed` is the policy that saw the prefill,
  // of which this cache holds a copy: its bytes as they stand (a copy's vectors may hold
  // less spare room) go into the peak.
  void load_prefill(const KvCache& source, int64_t chunk, const TokenPolicy* observed);

  int64_t bytes_resident() const;
  CacheStats stats() const;
  void reset_peak() { bytes_peak_ = bytes_resident(); }

 private:
  void compress(CachePhase phase);
  // What the policy is shown of a layer (LayerKv::view, or heads_view for a policy that
  // reads_ragged_heads).
  DenseKv policy_view(const LayerKv& store) const;
  // A policy scored by the attention every query row gives (TokenPolicy::ScoredRows::All)
  // over a store that attends and scores in one pass (LayerKv::attend_scored): both done,
  // the policy handed the scores; false where not (then attend, then observe).
  bool attend_scored(int32_t layer, const AttentionQuery& query);
  int64_t layer_bytes(int32_t layer) const;  // store, policy state and read metadata

  KvShape shape_;
  std::vector<std::unique_ptr<LayerKv>> layers_;
  std::unique_ptr<TokenPolicy> policy_;
  std::unique_ptr<ReadPolicy> reader_;
  int32_t next_position_ = 0;
  bool context_ended_ = false;
  bool decode_step_ = false;
  bool settle_chunks_ = false;
  int64_t bytes_peak_ = 0;
  int64_t tokens_evicted_ = 0;
  int64_t bytes_read_forward_ = 0;  // this forward so far
  int64_t bytes_read_last_ = 0;     // the last finished forward
  int64_t bytes_read_total_ = 0;
  KvTap* tap_ = nullptr;
  std::shared_ptr<const PrefillAttention> prefill_;  // immutable, shared by clones
  int64_t forward_end_ = 0;
  double attn_flops_ = 0;
  double attn_flops_dense_ = 0;
};

}  // namespace kvbench
