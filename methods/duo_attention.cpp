// DuoAttention: whole KV heads are of two kinds. Retrieval heads keep every token; streaming
// heads keep the first `sink` tokens and the `recent` newest, evicting the oldest non-sink
// token after every forward. Which heads retrieve comes from a per-head score: the heads
// ranked over all layers together, the best fraction retrieve. Each head really holds its
// own count (RetainPlan::head_keep), so the streaming heads' memory is freed.
//
// Authors' settings (mit-han-lab/duo-attention; docs/methods.md, "Where sources differ"):
// - per (layer, KV head) gate alpha, LEARNED: 2000 steps of MSE between the full and the
//   mixed model's hidden states on passkey data, + 0.05 L1(alpha) (duo_attn/train.py); not
//   training-free. kvbench scores heads training-free instead: a needle probe
//   (harness/head_probe.h) gives KvShape::head_retrieval, the attention the head's queries
//   pay to a pass key when answering it, cached per model file sha256.
// - deployment: retrieval = the top (1 - sparsity) fraction over all heads
//   (duo_attn/utils.py sparsify_attention_heads, a quantile over the whole map); sink 64,
//   recent 256 on LongBench (scripts/longbench.sh); streaming heads trimmed after every
//   forward (llama_duo_attention_forward_one_way_reordered).
// - kvpress DuoAttentionPress (presses/duo_attention_press.py): head_compression_ratio is
//   the fraction of streaming heads, the lowest-scoring of np.argsort over all heads; the
//   compression it reports is that fraction times 1 - (sink + recent) / n. Here the budget
//   sets that fraction the other way round: with n context tokens, a budget of B per head
//   and s = sink + recent, R = floor(H (B - s) / (n - s)) of the H heads retrieve, so the
//   mean over all heads is at most B at the end of the context; kvpress masks the streaming
//   heads' middle tokens instead of freeing them.
#include "methods/duo_attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>

#include "cache/registry.h"
#include "common/files.h"
#include "common/input_error.h"

namespace kvbench {

DuoAttentionPolicy::DuoAttentionPolicy(Budget budget, int64_t sink, int64_t recent,
                                       int32_t n_layers, int32_t n_kv_heads,
                                       std::vector<float> head_retrieval)
    : budget_(budget),
      sink_(sink),
      recent_(recent),
      n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_retrieval_(std::move(head_retrieval)),
      streaming_(static_cast<size_t>(n_layers) * n_kv_heads, 0),
      ragged_(static_cast<size_t>(n_layers), 0),
      held_(static_cast<size_t>(n_layers)) {}

std::unique_ptr<TokenPolicy> DuoAttentionPolicy::clone() const {
  return std::make_unique<DuoAttentionPolicy>(*this);
}

bool DuoAttentionPolicy::streaming(int32_t layer, int32_t head) const {
  return streaming_[static_cast<size_t>(layer) * n_kv_heads_ + head] != 0;
}

const std::vector<int32_t>& DuoAttentionPolicy::held_positions(int32_t layer, int32_t head) const {
  static const std::vector<int32_t> none;
  return ragged_[layer] ? held_[layer][head] : none;
}

void DuoAttentionPolicy::split(int64_t n_context) {
  split_ = true;
  const int64_t keep = budget_.resolve(n_context);
  if (keep >= n_context) return;  // room for the whole context: every head retrieves
  // A budget below sink + recent shortens the recent window first, then the sinks.
  sink_kept_ = std::min(sink_, keep);
  recent_kept_ = std::min(recent_, keep - sink_kept_);
  const int64_t window = sink_kept_ + recent_kept_;
  const int64_t heads = static_cast<int64_t>(n_layers_) * n_kv_heads_;
  // keep >= window and n_context > keep: R n + (H - R) window <= H keep.
  const int64_t retrieval = heads * (keep - window) / (n_context - window);
  std::vector<int64_t> order(static_cast<size_t>(heads));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return head_retrieval_[a] > head_retrieval_[b];
  });
  for (int64_t i = retrieval; i < heads; ++i) streaming_[order[i]] = 1;
}

void DuoAttentionPolicy::observe(int32_t layer, const AttentionQuery& query, const DenseKv&) {
  // A ragged store appends the forward's tokens at the end of every head.
  if (!ragged_[layer]) return;
  for (std::vector<int32_t>& head : held_[layer]) {
    head.insert(head.end(), query.q_positions, query.q_positions + query.n_queries);
  }
}

bool DuoAttentionPolicy::plan(int32_t layer, const DenseKv& kv, CachePhase phase,
                              RetainPlan& plan) {
  if (phase == CachePhase::ContextChunk) return false;
  if (!split_) split(kv.n_tokens);  // the first plan is at the end of the shared context
  bool streams = false;
  for (int32_t h = 0; h < n_kv_heads_; ++h) streams = streams || streaming(layer, h);
  if (!streams) return false;  // a layer of retrieval heads keeps everything
  std::vector<std::vector<int32_t>> positions;
  if (ragged_[layer]) {
    positions = held_[layer];
  } else {
    assert(kv.positions);
    positions.resize(n_kv_heads_);
    for (int32_t h = 0; h < n_kv_heads_; ++h) {
      const int32_t* row = kv.positions + h * kv.capacity;
      positions[h].assign(row, row + kv.n_tokens);
    }
  }
  const int64_t window = sink_kept_ + recent_kept_;
  bool drops = false;
  plan.head_keep.assign(n_kv_heads_, 0);
  plan.slots.clear();
  plan.k.clear();
  plan.v.clear();
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    const std::vector<int32_t>& held = positions[h];
    const int64_t n = static_cast<int64_t>(held.size());
    std::vector<int32_t> slots(static_cast<size_t>(n));
    std::iota(slots.begin(), slots.end(), 0);
    if (streaming(layer, h) && n > window) {
      // By position: the sink_kept_ oldest and the recent_kept_ newest stay.
      std::vector<int32_t> by_age = slots;
      std::sort(by_age.begin(), by_age.end(),
                [&](int32_t a, int32_t b) { return held[a] < held[b]; });
      slots.assign(by_age.begin(), by_age.begin() + sink_kept_);
      slots.insert(slots.end(), by_age.end() - recent_kept_, by_age.end());
      std::sort(slots.begin(), slots.end());
      drops = true;
    }
    plan.head_keep[h] = static_cast<int64_t>(slots.size());
    plan.slots.insert(plan.slots.end(), slots.begin(), slots.end());
  }
  if (!drops) return false;
  plan.n_keep = *std::max_element(plan.head_keep.begin(), plan.head_keep.end());
  held_[layer] = std::move(positions);  // retained() moves them with their slots
  return true;
}

void DuoAttentionPolicy::retained(int32_t layer, const RetainPlan& plan) {
  std::vector<std::vector<int32_t>>& held = held_[layer];
  for (int32_t h = 0; h < n_kv_heads_; ++h) {
    std::vector<int32_t> moved(static_cast<size_t>(plan.kept(h)));
    const int32_t* from = plan.slots.data() + plan.head_offset(h);
    for (size_t j = 0; j < moved.size(); ++j) moved[j] = held[h][from[j]];
    held[h] = std::move(moved);
  }
  ragged_[layer] = 1;
}

int64_t DuoAttentionPolicy::bytes_resident(int32_t layer) const {
  if (!ragged_[layer]) return 0;
  int64_t bytes = 0;
  for (const std::vector<int32_t>& head : held_[layer]) {
    bytes += static_cast<int64_t>(head.size() * sizeof(int32_t));
  }
  return bytes;
}

namespace {

// The authors' gate file (duo_attn/utils.py load_attn_pattern: np.loadtxt, tab-separated, one
// row per layer, one gate per KV head; gates clipped to [0, 1] as np.clip there).
std::vector<std::vector<float>> read_gate_pattern(const std::string& path) {
  // A regular file of at most 1 MiB (common/files.h): a FIFO or /dev/zero is refused.
  std::istringstream in(read_regular_file(path, "duo_attention pattern file", 1 << 20));
  std::vector<std::vector<float>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::istringstream fields(line);
    std::vector<float> row;
    std::string field;
    while (fields >> field) {
      char* end = nullptr;
      const float gate = std::strtof(field.c_str(), &end);
      if (end == field.c_str() || *end != '\0' || !std::isfinite(gate)) {
        throw InputError("duo_attention: pattern " + path + ": line " +
                         std::to_string(rows.size() + 1) + ": '" + field + "' is not a number");
      }
      row.push_back(std::clamp(gate, 0.f, 1.f));
    }
    if (!rows.empty() && row.size() != rows.front().size()) {
      throw InputError("duo_attention: pattern " + path + ": line " +
                       std::to_string(rows.size() + 1) + " has " + std::to_string(row.size()) +
                       " gates, line 1 " + std::to_string(rows.front().size()));
    }
    rows.push_back(std::move(row));
    if (rows.size() > 4096) throw InputError("duo_attention: pattern " + path + ": too many rows");
  }
  if (rows.empty()) throw InputError("duo_attention: pattern " + path + ": no gates");
  return rows;
}

// The gates as head scores [layer * n_kv_heads + head], for a model of `shape`.
std::vector<float> gates_for(const std::string& path, const KvShape& shape) {
  const std::vector<std::vector<float>> rows = read_gate_pattern(path);
  if (rows.size() != static_cast<size_t>(shape.n_layers) ||
      rows.front().size() != static_cast<size_t>(shape.n_kv_heads)) {
    throw InputError("duo_attention: pattern " + path + " holds " + std::to_string(rows.size()) +
                     " layers x " + std::to_string(rows.front().size()) +
                     " KV heads; this model has " + std::to_string(shape.n_layers) + " x " +
                     std::to_string(shape.n_kv_heads));
  }
  std::vector<float> scores;
  for (const std::vector<float>& row : rows) scores.insert(scores.end(), row.begin(), row.end());
  return scores;
}

}  // namespace

// Registered as `duo_attention` (methods/method_list.cpp).
MethodInfo duo_attention_method() {
  MethodInfo info;
  info.name = "duo_attention";
  info.stage = "2 (after prefill) + decode: streaming heads trimmed after every forward";
  info.summary =
      "retrieval KV heads keep every token, streaming heads the first `sink` and the `recent` "
      "newest; heads ranked by a needle probe of the model";
  info.paper =
      "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming Heads "
      "(Xiao et al.), ICLR 2025, arXiv 2410.10819";
  info.choices = {
      "NOT the paper's heads: the authors LEARN a gate per KV head (2000 optimisation steps on "
      "passkey data); kvbench finds them training-free, by the attention each KV head's "
      "queries pay to a pass key when answering it in 4 generated needle probes "
      "(harness/head_probe.h) of about 265 tokens, cached per model file sha256. "
      "pattern=FILE takes the authors' gates instead (their full_attention_heads.tsv, "
      "published for Llama-3-8B, Llama-3.1-8B and Mistral-7B), ranked the same way, or the "
      "probe at the length a sweep runs, as `kvbench probe-heads --context-tokens N` writes it "
      "(configs/duo/: 4K probes of the three models)",
      "budget/ratio set the share of retrieval heads, R = floor(H (B - s) / (n - s)) of all H "
      "heads for budget B, context n and s = sink + recent, so the mean over all layers' heads "
      "is at most B at the end of the context (kvpress's head_compression_ratio is the "
      "streaming share itself); heads ranked over all layers together, so a layer's own mean "
      "varies, and retrieval heads grow by every later token",
      "sink 64 and recent 256 are the authors' LongBench settings; on kvbench's 1K-8K contexts "
      "that window is a large share of the context, so few heads retrieve at a given budget. "
      "A budget below sink + recent shortens recent, then sink, and every head streams",
      "each head really holds its own count (kvpress masks the streaming heads' middle "
      "tokens), on the CPU or the GPU, in the fp32 store or behind a storage method that "
      "holds heads apart (fp16, bf16, fp8, kivi)",
  };
  info.params = budget_params(kDefaultBudget);
  info.params.push_back(int_param("sink", 64, 0, kMaxTokens,
                                  "initial tokens a streaming head keeps (authors: 64)"));
  info.params.push_back(int_param("recent", 256, 1, kMaxTokens,
                                  "newest tokens a streaming head keeps (authors: 256)"));
  info.params.push_back(text_param(
      "pattern", "",
      "the authors' learned gates: a full_attention_heads.tsv of their attn_patterns/ (one "
      "row per layer, one gate per KV head), or kvbench probe-heads' file of the probe at "
      "another length; empty: kvbench's needle probe of about 265 tokens"));
  info.ragged_heads = true;
  info.needs_head_retrieval = true;  // unless a pattern is given (harness/head_probe.h)
  info.check = [](const MethodParams& params) {
    check_budget(params);
    if (params.has("pattern")) read_gate_pattern(params.get("pattern"));
  };
  info.make_policy = [](const MethodParams& params, const KvShape& shape) {
    const size_t heads = static_cast<size_t>(shape.n_layers) * shape.n_kv_heads;
    if (params.has("pattern")) {
      return std::unique_ptr<TokenPolicy>(new DuoAttentionPolicy(
          budget_from(params), params.get_int("sink"), params.get_int("recent"), shape.n_layers,
          shape.n_kv_heads, gates_for(params.get("pattern"), shape)));
    }
    if (shape.head_retrieval.size() != heads) {
      throw InputError(
          "duo_attention finds its retrieval heads with a probe of the model; this cache was "
          "built without one (KvShape::head_retrieval holds " +
          std::to_string(shape.head_retrieval.size()) + " scores for " + std::to_string(heads) +
          " KV heads): run it through kvbench run, session or sweep, which probe the model");
    }
    return std::unique_ptr<TokenPolicy>(new DuoAttentionPolicy(
        budget_from(params), params.get_int("sink"), params.get_int("recent"), shape.n_layers,
        shape.n_kv_heads, shape.head_retrieval));
  };
  return info;
}

}  // namespace kvbench
