// DuoAttention: on a hand-made head map the best-scoring heads keep every token and the rest
// exactly sink + recent, before and during decode; the store really holds those tokens (the
// attention it computes is the reference softmax over them); the needle probe of a tiny model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/head_probe.h"
#include "methods/duo_attention.h"
#include "tests/cache_feed.h"
#include "tests/gguf_writer.h"
#include "tests/kept_positions.h"

using namespace kvbench;
using testing::Chunk;

namespace {

constexpr int32_t kHeads = 4;  // query heads: 2 per KV head
constexpr int64_t kContext = 40;

// 2 layers of 2 KV heads; ranked over all: (0,0) 0.9, (1,1) 0.8, (1,0) 0.2, (0,1) 0.1.
KvShape shape() {
  KvShape s;
  s.n_layers = 2;
  s.n_kv_heads = 2;
  s.head_dim = 4;
  s.head_retrieval = {0.9f, 0.1f, 0.2f, 0.8f};
  return s;
}

std::vector<int32_t> sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int32_t> range(int32_t from, int32_t to) {
  std::vector<int32_t> v(static_cast<size_t>(to - from));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Attention of query head `qh` of `q` (one row) over the tokens at `positions`, whose keys and
// values are row p of all_k / all_v ([position, n_kv_heads, head_dim]).
std::vector<double> reference(const std::vector<float>& q, int32_t qh, const std::vector<float>& all_k,
                              const std::vector<float>& all_v, const std::vector<int32_t>& positions,
                              const KvShape& s) {
  const int32_t d = s.head_dim, kv = qh / (kHeads / s.n_kv_heads);
  std::vector<double> logits;
  double top = -1e300;
  for (int32_t p : positions) {
    double dot = 0;
    for (int32_t c = 0; c < d; ++c) {
      dot += q[qh * d + c] * all_k[(p * s.n_kv_heads + kv) * d + c];
    }
    logits.push_back(dot / std::sqrt(static_cast<double>(d)));
    top = std::max(top, logits.back());
  }
  double sum = 0;
  for (double& l : logits) sum += (l = std::exp(l - top));
  std::vector<double> out(d, 0.0);
  for (size_t i = 0; i < positions.size(); ++i) {
    for (int32_t c = 0; c < d; ++c) {
      out[c] += logits[i] / sum * all_v[(positions[i] * s.n_kv_heads + kv) * d + c];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("duo_attention: retrieval heads keep all, streaming heads sink + recent", "[duo_attention]") {
  const KvShape s = shape();
  // H (B - s) / (n - s) = 4 (24 - 8) / (40 - 8) = 2 retrieval heads: (0,0) and (1,1).
  KvCache cache = make_cache("duo_attention:budget=24,sink=2,recent=6", s);
  const auto& policy = dynamic_cast<const DuoAttentionPolicy&>(*cache.policy());
  std::mt19937 rng(7);
  const Chunk context = testing::random_chunk(kContext, s, kHeads, rng);
  std::vector<float> all_k = context.k, all_v = context.v;
  testing::feed(cache, kHeads, context);
  cache.end_context();

  CHECK(cache.stats().tokens_per_head == std::vector<int64_t>{40, 8, 8, 40});
  CHECK_FALSE(policy.streaming(0, 0));
  CHECK(policy.streaming(0, 1));
  CHECK(policy.streaming(1, 0));
  CHECK_FALSE(policy.streaming(1, 1));
  std::vector<int32_t> window = {0, 1};
  for (int32_t p : range(34, 40)) window.push_back(p);
  CHECK(sorted(policy.held_positions(0, 1)) == window);
  CHECK(sorted(policy.held_positions(1, 0)) == window);
  CHECK(sorted(policy.held_positions(0, 0)) == range(0, 40));
  // The mean over all heads is the budget.
  const std::vector<int64_t> per_head = cache.stats().tokens_per_head;
  CHECK(std::accumulate(per_head.begin(), per_head.end(), int64_t{0}) <= 4 * 24);

  for (int step = 0; step < 5; ++step) {
    const Chunk token = testing::random_chunk(1, s, kHeads, rng);
    all_k.insert(all_k.end(), token.k.begin(), token.k.end());
    all_v.insert(all_v.end(), token.v.begin(), token.v.end());
    const int32_t at = static_cast<int32_t>(kContext + step);
    // What the streaming head held before the step, and the new token, is what it attends.
    std::vector<int32_t> read = policy.held_positions(0, 1);
    read.push_back(at);
    const std::vector<float> out = testing::decode_step(cache, kHeads, token);
    for (int32_t qh : {2, 3}) {  // layer 0, KV head 1 (streaming)
      const std::vector<double> want = reference(token.q, qh, all_k, all_v, read, s);
      for (int32_t c = 0; c < s.head_dim; ++c) {
        CHECK(out[qh * s.head_dim + c] == Approx(want[c]).margin(1e-5));
      }
    }
    for (int32_t qh : {0, 1}) {  // layer 0, KV head 0 (retrieval): every token
      const std::vector<double> want = reference(token.q, qh, all_k, all_v, range(0, at + 1), s);
      for (int32_t c = 0; c < s.head_dim; ++c) {
        CHECK(out[qh * s.head_dim + c] == Approx(want[c]).margin(1e-5));
      }
    }
    std::vector<int32_t> now = {0, 1};
    for (int32_t p : range(at - 5, at + 1)) now.push_back(p);
    CHECK(sorted(policy.held_positions(0, 1)) == now);
    CHECK(sorted(policy.held_positions(1, 0)) == now);
    CHECK(sorted(policy.held_positions(1, 1)) == range(0, at + 1));
    // The positions the policy follows are the store's, slot by slot.
    for (int32_t l = 0; l < s.n_layers; ++l) {
      for (int32_t h = 0; h < s.n_kv_heads; ++h) {
        const DenseKv head =
            dynamic_cast<const DenseLayerKv&>(cache.layer(l)).head_view(h);
        CHECK(std::vector<int32_t>(head.positions, head.positions + head.n_tokens) ==
              policy.held_positions(l, h));
        CHECK(testing::kept(cache, l, h) == sorted(policy.held_positions(l, h)));
      }
    }
    const int64_t all = at + 1;
    CHECK(cache.stats().tokens_per_head == std::vector<int64_t>{all, 8, 8, all});
  }
}

TEST_CASE("duo_attention: the budget sets the share of retrieval heads", "[duo_attention]") {
  const KvShape s = shape();
  std::mt19937 rng(3);
  const Chunk context = testing::random_chunk(kContext, s, kHeads, rng);
  struct Case {
    const char* spec;
    std::vector<int64_t> per_head;
  };
  for (const Case& c : {Case{"duo_attention:budget=2000,sink=2,recent=6", {40, 40, 40, 40}},
                        Case{"duo_attention:ratio=1,sink=2,recent=6", {40, 40, 40, 40}},
                        Case{"duo_attention:budget=16,sink=2,recent=6", {40, 8, 8, 8}},
                        Case{"duo_attention:budget=8,sink=2,recent=6", {8, 8, 8, 8}},
                        Case{"duo_attention:budget=5,sink=2,recent=6", {5, 5, 5, 5}},
                        Case{"duo_attention:ratio=0.8,sink=2,recent=6", {40, 8, 40, 40}}}) {
    INFO(c.spec);
    KvCache cache = make_cache(c.spec, s);
    testing::feed(cache, kHeads, context);
    cache.end_context();
    CHECK(cache.stats().tokens_per_head == c.per_head);
  }
}

TEST_CASE("duo_attention: refusals", "[duo_attention]") {
  KvShape no_probe = shape();
  no_probe.head_retrieval.clear();
  CHECK_THROWS_WITH(make_cache("duo_attention:ratio=0.5", no_probe),
                    Catch::Contains("probe of the model"));
  CHECK_THROWS_AS(resolve_method_spec("duo_attention:ratio=0.5+mikv"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("adakv+duo_attention:ratio=0.5"), InputError);
  CHECK_THROWS_AS(resolve_method_spec("duo_attention:budget=64,ratio=0.5"), InputError);
}

TEST_CASE("duo_attention: the needle probe of a tiny model, cached by its sha256", "[duo_attention]") {
  testing::TinyLlamaSpec spec;
  spec.context_length = 2048;  // the tiny tokenizer's bytes make the probe ~900 tokens
  const std::string path = testing::temp_path("tiny_duo_probe.gguf");
  testing::write_tiny_llama_gguf(path, spec);
  const auto model = LlamaModel::load(path);
  const std::vector<float> scores = probe_retrieval_heads(*model);
  REQUIRE(scores.size() == static_cast<size_t>(spec.n_layer * spec.n_head_kv));
  for (float x : scores) {
    CHECK(std::isfinite(x));
    CHECK(x >= 0.f);
    CHECK(x <= 1.f);
  }
  CHECK(probe_retrieval_heads(*model) == scores);  // deterministic

  const std::filesystem::path dir = testing::temp_path("duo_heads_cache");
  std::filesystem::remove_all(dir);
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  CHECK(cached_retrieval_heads(*model, path) == scores);
  REQUIRE(std::filesystem::exists(dir / "kvbench" / "heads"));
  CHECK(std::distance(std::filesystem::directory_iterator(dir / "kvbench" / "heads"),
                      std::filesystem::directory_iterator()) == 1);
  CHECK(cached_retrieval_heads(*model, path) == scores);  // read back from the file
  ::unsetenv("XDG_CACHE_HOME");
}

TEST_CASE("duo_attention: pattern=FILE ranks heads by the authors' learned gates",
          "[duo_attention]") {
  // The authors' format (attn_patterns/*/full_attention_heads.tsv): one row per layer, one
  // tab-separated gate per KV head, clipped to [0, 1]. Made here for the test shape (2 x 2),
  // ranked the other way round from the probe's scores in shape(): (0,1) and (1,0) retrieve.
  const std::string path = testing::temp_path("full_attention_heads.tsv");
  {
    std::ofstream out(path);
    out << "1.0e-2\t1.7\n9.0e-01\t-0.3\n";
  }
  KvShape s = shape();
  s.head_retrieval.clear();  // no probe needed
  KvCache cache = make_cache("duo_attention:budget=24,sink=2,recent=6,pattern=" + path, s);
  std::mt19937 rng(5);
  testing::feed(cache, kHeads, testing::random_chunk(kContext, s, kHeads, rng));
  cache.end_context();
  CHECK(cache.stats().tokens_per_head == std::vector<int64_t>{8, 40, 40, 8});

  // A file that does not fit the model, or is not the authors' format: one line naming it.
  const auto write = [](const std::string& name, const std::string& text) {
    const std::string p = testing::temp_path(name);
    std::ofstream(p) << text;
    return p;
  };
  CHECK_THROWS_WITH(make_cache("duo_attention:budget=24,pattern=" +
                                   write("three_layers.tsv", "1\t0\n0\t1\n1\t1\n"), s),
                    Catch::Contains("holds 3 layers x 2 KV heads; this model has 2 x 2"));
  CHECK_THROWS_WITH(resolve_method_spec("duo_attention:budget=24,pattern=" +
                                        write("ragged.tsv", "1\t0\n0\n")),
                    Catch::Contains("line 2 has 1 gates, line 1 2"));
  CHECK_THROWS_WITH(resolve_method_spec("duo_attention:budget=24,pattern=" +
                                        write("words.tsv", "1\tx\n")),
                    Catch::Contains("'x' is not a number"));
  CHECK_THROWS_WITH(resolve_method_spec("duo_attention:budget=24,pattern=/nonexistent.tsv"),
                    Catch::Contains("cannot open the duo_attention pattern file"));
}
