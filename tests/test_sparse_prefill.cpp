// Sparse prefill (a_shape, tri_shape, minference): the kernel's equality with dense attention
// when the pattern reads every key, hand-made patterns whose kept keys are known, MInference
// finding a planted column and diagonal, exact FLOP counts, and spec refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/model/llama_model.h"
#include "harness/model_cache.h"
#include "harness/shared_prefill.h"
#include "kernels/cpu/attention.h"
#include "methods/sparse_prefill.h"
#include "tests/attention_problem.h"
#include "tests/gguf_writer.h"

using namespace kvbench;

namespace {

constexpr int32_t kAll = std::numeric_limits<int32_t>::max();

SparsePattern shape_pattern(int32_t sink, int32_t local, int32_t dense_from = kAll) {
  return SparsePattern{sink, local, dense_from, nullptr, 0, nullptr, 0};
}

std::vector<float> run_sparse(testing::AttentionProblem& p, const SparsePattern& pattern,
                              AttentionPairs* pairs = nullptr) {
  std::vector<float> out(p.q.size(), 123.0f);
  AttentionQuery q = p.query;
  q.out = out.data();
  const AttentionPairs got = attention_sparse_cpu(q, p.kv, pattern);
  if (pairs) *pairs = got;
  return out;
}

// Six tokens at positions 0..5 of one KV head, head_dim 4, two query heads, every token a
// query: a prefill chunk of the whole prompt.
struct SixTokens {
  std::vector<float> k, v, q;
  std::vector<int32_t> positions{0, 1, 2, 3, 4, 5};
  DenseKv kv{};
  AttentionQuery query{};
  SixTokens() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (int i = 0; i < 6 * 4; ++i) {
      k.push_back(uni(rng));
      v.push_back(uni(rng));
    }
    for (int i = 0; i < 6 * 2 * 4; ++i) q.push_back(2.0f * uni(rng));
    kv = DenseKv{k.data(), v.data(), positions.data(), 1, 4, 6, 6};
    query = AttentionQuery{q.data(), positions.data(), nullptr, 6, 2, 0.5f};
  }
  // Softmax attention of query row i, head h over the listed key positions, in double.
  std::vector<double> expected(int i, int h, const std::vector<int>& keys) const {
    std::vector<double> logits;
    double m = -1e300;
    for (int t : keys) {
      double dot = 0;
      for (int d = 0; d < 4; ++d) dot += double{q[(i * 2 + h) * 4 + d]} * k[t * 4 + d];
      logits.push_back(dot * 0.5);
      m = std::max(m, logits.back());
    }
    std::vector<double> out(4, 0.0);
    double sum = 0;
    for (size_t j = 0; j < keys.size(); ++j) {
      const double p = std::exp(logits[j] - m);
      sum += p;
      for (int d = 0; d < 4; ++d) out[d] += p * v[keys[j] * 4 + d];
    }
    for (double& x : out) x /= sum;
    return out;
  }
};

// Checks attention_sparse_cpu against a plain double-precision attention over the keys the
// pattern's rule (layouts.h) reads, computed here key by key, and its pair counts exactly.
void check_against_rule(testing::AttentionProblem& p, const SparsePattern& pattern) {
  AttentionPairs pairs;
  const std::vector<float> got = run_sparse(p, pattern, &pairs);
  const AttentionQuery& q = p.query;
  const int dim = p.kv.head_dim, group = q.n_heads / p.kv.n_kv_heads;
  const auto listed = [](const int32_t* list, int32_t n, int h, int32_t x) {
    for (int32_t j = 0; j < n; ++j) {
      if (list[static_cast<int64_t>(h) * n + j] == x) return true;
    }
    return false;
  };
  int64_t computed = 0, dense = 0;
  for (int i = 0; i < q.n_queries; ++i) {
    const int32_t qp = q.q_positions[i];
    for (int h = 0; h < q.n_heads; ++h) {
      const int64_t head = static_cast<int64_t>(h / group) * p.kv.capacity;
      std::vector<double> logits;
      std::vector<int64_t> slots;
      for (int64_t t = 0; t < p.kv.n_tokens; ++t) {
        const int32_t kp = p.kv.positions[head + t];
        if (kp > qp) continue;
        ++dense;
        const bool reads = qp >= pattern.dense_from || kp < pattern.sink ||
                           qp - kp < pattern.local ||
                           listed(pattern.columns, pattern.n_columns, h, kp) ||
                           listed(pattern.offsets, pattern.n_offsets, h, qp - kp);
        if (!reads) continue;
        double dot = 0;
        for (int d = 0; d < dim; ++d) {
          dot += double{q.q[(static_cast<int64_t>(i) * q.n_heads + h) * dim + d]} *
                 p.kv.k[(head + t) * dim + d];
        }
        logits.push_back(dot * q.scale);
        slots.push_back(t);
      }
      computed += static_cast<int64_t>(slots.size());
      double m = -1e300, sum = 0;
      for (double l : logits) m = std::max(m, l);
      std::vector<double> acc(dim, 0.0);
      for (size_t j = 0; j < slots.size(); ++j) {
        const double w = std::exp(logits[j] - m);
        sum += w;
        for (int d = 0; d < dim; ++d) acc[d] += w * p.kv.v[(head + slots[j]) * dim + d];
      }
      for (int d = 0; d < dim; ++d) {
        const float want = sum > 0 ? static_cast<float>(acc[d] / sum) : 0.0f;
        REQUIRE(got[(static_cast<int64_t>(i) * q.n_heads + h) * dim + d] ==
                Approx(want).margin(1e-5));
      }
    }
  }
  CHECK(pairs.computed == computed);
  CHECK(pairs.dense == dense);
}

}  // namespace

TEST_CASE("sparse prefill: kept keys and pair counts follow the rule over many tiles",
          "[unit][sparse_prefill]") {
  // 400 keys with gapped positions: several query and key tiles, so tiles are skipped
  // whole, folded whole and tested key by key.
  for (const bool shuffled : {false, true}) {
    testing::AttentionProblem p({4, 2, 16, 400, 300, shuffled});
    INFO("shuffled " << shuffled);
    check_against_rule(p, shape_pattern(8, 40));
    check_against_rule(p, shape_pattern(0, 70, 600));
    std::vector<int32_t> columns, offsets;
    for (int h = 0; h < 4; ++h) {
      // A key on a column and a diagonal, and entries listed twice, count once.
      for (int32_t x : {3 + h, 200, 517, 200}) columns.push_back(x);
      for (int32_t x : {0, 1, 150 + 7 * h, 1}) offsets.push_back(x);
    }
    SparsePattern lists = shape_pattern(0, 0);
    lists.columns = columns.data();
    lists.n_columns = 4;
    lists.offsets = offsets.data();
    lists.n_offsets = 4;
    check_against_rule(p, lists);
  }
}

TEST_CASE("sparse prefill: a pattern reading every key equals dense bit for bit",
          "[unit][sparse_prefill]") {
  const std::vector<testing::Case> cases = {
      {4, 2, 16, 37, 37},  {14, 2, 64, 300, 300}, {8, 8, 32, 1200, 200},
      {6, 3, 64, 700, 1, false}, {4, 1, 16, 150, 40, true},
      {4, 1, 16, 1500, 2},  // few work items: the dense plan splits the keys (split-K)
  };
  for (const testing::Case& c : cases) {
    INFO(c.n_heads << " heads, " << c.n_tokens << " tokens, " << c.n_queries << " queries");
    testing::AttentionProblem p(c);
    const std::vector<float> dense = p.run(attention_dense_cpu);
    AttentionPairs pairs;
    // Every key by sink, by the local window, by dense rows, and by columns covering every
    // position (MInference with sizes past the prompt).
    for (const SparsePattern& all :
         {shape_pattern(kAll, 0), shape_pattern(0, kAll), shape_pattern(0, 0, 0)}) {
      const std::vector<float> got = run_sparse(p, all, &pairs);
      for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == dense[i]);
      CHECK(pairs.computed == pairs.dense);
      CHECK(pairs.dense > 0);
    }
    int32_t span = 0;
    for (int32_t qp : p.q_positions) span = std::max(span, qp + 1);
    std::vector<int32_t> columns;
    for (int h = 0; h < c.n_heads; ++h) {
      for (int32_t x = 0; x < span; ++x) columns.push_back(x);
    }
    SparsePattern by_columns = shape_pattern(0, 0);
    by_columns.columns = columns.data();
    by_columns.n_columns = span;
    const std::vector<float> got = run_sparse(p, by_columns, &pairs);
    for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == dense[i]);
    SparsePattern by_offsets = shape_pattern(0, 0);
    by_offsets.offsets = columns.data();
    by_offsets.n_offsets = span;
    const std::vector<float> got_offsets = run_sparse(p, by_offsets, &pairs);
    for (size_t i = 0; i < got.size(); ++i) REQUIRE(got_offsets[i] == dense[i]);
  }
}

TEST_CASE("sparse prefill: a_shape sink=1 local=2 reads the first key and the last two",
          "[unit][sparse_prefill]") {
  SixTokens six;
  std::vector<float> out(six.q.size());
  AttentionQuery q = six.query;
  q.out = out.data();
  const AttentionPairs pairs = attention_sparse_cpu(q, six.kv, shape_pattern(1, 2));
  // Row i reads {0, i - 1, i} (those that exist): 1 + 2 + 3 + 3 + 3 + 3 keys per head.
  const std::vector<std::vector<int>> kept = {{0},       {0, 1},    {0, 1, 2},
                                              {0, 2, 3}, {0, 3, 4}, {0, 4, 5}};
  for (int i = 0; i < 6; ++i) {
    for (int h = 0; h < 2; ++h) {
      const std::vector<double> want = six.expected(i, h, kept[i]);
      for (int d = 0; d < 4; ++d) {
        INFO("row " << i << " head " << h << " dim " << d);
        CHECK(out[(i * 2 + h) * 4 + d] == Approx(want[d]).margin(1e-6));
      }
    }
  }
  CHECK(pairs.computed == 2 * 15);
  CHECK(pairs.dense == 2 * 21);

  // The same keys by Quest's page reference (page_tokens 1, per row): row 5 reads pages 0, 4, 5.
  std::vector<float> ref(six.q.size());
  const int32_t pages[] = {0, 4, 5};
  AttentionQuery last = last_query_row(six.query, 4);
  last.out = ref.data();
  attention_pages_reference(last, six.kv, PageSelection{pages, 3, 1});
  for (int e = 0; e < 2 * 4; ++e) CHECK(out[5 * 2 * 4 + e] == Approx(ref[e]).margin(1e-6));
}

TEST_CASE("sparse prefill: tri_shape's last rows attend densely", "[unit][sparse_prefill]") {
  SixTokens six;
  std::vector<float> dense(six.q.size()), out(six.q.size());
  AttentionQuery q = six.query;
  q.out = dense.data();
  attention_dense_cpu(q, six.kv);
  SparsePrefillRule rule;
  rule.shape = SparsePrefillRule::Shape::TriShape;
  rule.sink = 1;
  rule.local = 1;
  rule.last = 2;
  const SparsePrefill tri(rule);
  const BuiltPattern built = tri.pattern(six.query, six.kv, 6);
  CHECK(built.pattern.dense_from == 4);
  q.out = out.data();
  const AttentionPairs pairs = tri.attend(q, six.kv, 6);
  for (int e = 4 * 2 * 4; e < 6 * 2 * 4; ++e) REQUIRE(out[e] == dense[e]);  // rows 4, 5
  for (int i = 0; i < 4; ++i) {
    const std::vector<int> keys = i == 0 ? std::vector<int>{0} : std::vector<int>{0, i};
    for (int h = 0; h < 2; ++h) {
      const std::vector<double> want = six.expected(i, h, keys);
      for (int d = 0; d < 4; ++d) CHECK(out[(i * 2 + h) * 4 + d] == Approx(want[d]).margin(1e-6));
    }
  }
  CHECK(pairs.computed == 2 * (1 + 2 + 2 + 2 + 5 + 6));
  // A later forward's end moves the dense rows: a chunk ending before it has none.
  CHECK(tri.pattern(six.query, six.kv, 100).pattern.dense_from == 98);
}

TEST_CASE("sparse prefill: minference finds a planted column and a planted diagonal",
          "[unit][sparse_prefill]") {
  // 200 tokens at positions 0..199, one KV head, two query heads, head_dim 64. Channel 0:
  // every query 8, only the key at position 40 has 1 (a vertical line). Channels 1..63: the
  // query at p is 8 r_p, the key at t is r_{t + 45} for random unit vectors r (a diagonal at
  // offset 45).
  const int n = 200, dim = 64, heads = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> r(n + 46, std::vector<float>(dim, 0.0f));
  for (auto& u : r) {
    double norm = 0;
    for (int d = 1; d < dim; ++d) {
      u[d] = normal(rng);
      norm += double{u[d]} * u[d];
    }
    for (int d = 1; d < dim; ++d) u[d] = static_cast<float>(u[d] / std::sqrt(norm));
  }
  std::vector<float> k(n * dim), v(n * dim, 0.5f), q(n * heads * dim);
  std::vector<int32_t> positions(n);
  for (int t = 0; t < n; ++t) {
    positions[t] = t;
    for (int d = 1; d < dim; ++d) k[t * dim + d] = r[t + 45][d];
    k[t * dim] = t == 40 ? 1.0f : 0.0f;
    for (int h = 0; h < heads; ++h) {
      for (int d = 1; d < dim; ++d) q[(t * heads + h) * dim + d] = 8.0f * r[t][d];
      q[(t * heads + h) * dim] = 8.0f;
    }
  }
  const DenseKv kv{k.data(), v.data(), positions.data(), 1, dim, n, n};
  const AttentionQuery query{q.data(), positions.data(), nullptr, n, heads, 1.0f};
  SparsePrefillRule rule;
  rule.shape = SparsePrefillRule::Shape::MInference;
  rule.last_q = 64;
  rule.vertical = kForcedVertical + 1;
  rule.slash = kForcedSlash + 1;
  const BuiltPattern built = SparsePrefill(rule).pattern(query, kv, n);
  REQUIRE(built.pattern.n_columns == 31);
  REQUIRE(built.pattern.n_offsets == 31);
  for (int h = 0; h < heads; ++h) {
    INFO("head " << h);
    // Ascending: the 30 forced first ones, then the planted one.
    for (int j = 0; j < 30; ++j) CHECK(built.columns[h * 31 + j] == j);
    CHECK(built.columns[h * 31 + 30] == 40);
    for (int j = 0; j < 30; ++j) CHECK(built.offsets[h * 31 + j] == j);
    CHECK(built.offsets[h * 31 + 30] == 45);
  }
  // Sizes past the prompt keep every column: dense bit for bit.
  rule.vertical = rule.slash = 1000;
  std::vector<float> dense(q.size()), out(q.size());
  AttentionQuery qq = query;
  qq.out = dense.data();
  attention_dense_cpu(qq, kv);
  qq.out = out.data();
  const AttentionPairs pairs = SparsePrefill(rule).attend(qq, kv, n);
  for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == dense[i]);
  CHECK(pairs.computed == pairs.dense);
}

TEST_CASE("sparse prefill: the cache counts attention FLOPs of prefill only",
          "[unit][sparse_prefill]") {
  SixTokens six;
  KvShape shape;
  shape.n_layers = 1;
  shape.n_kv_heads = 1;
  shape.head_dim = 4;
  shape.n_heads = 2;
  KvCache cache = make_cache("a_shape:sink=1,local=2", shape);
  std::vector<float> out(six.q.size());
  AttentionQuery q = six.query;
  q.out = out.data();
  cache.begin_forward(6);
  cache.append(0, six.k.data(), six.v.data(), six.positions.data(), 6);
  cache.attend(0, q);
  cache.advance(6);
  // 30 pairs of 42 (the a_shape case above), 4 * head_dim FLOPs each.
  CHECK(cache.attn_flops() == 4.0 * 4 * 30);
  CHECK(cache.attn_flops_dense() == 4.0 * 4 * 42);
  CHECK(cache.clone().attn_flops() == cache.attn_flops());
  // A decode step is dense and not counted.
  const int32_t next = 6;
  cache.mark_decode_step();
  cache.append(0, six.k.data(), six.v.data(), &next, 1);
  AttentionQuery step{six.q.data(), &next, out.data(), 1, 2, 0.5f};
  cache.attend(0, step);
  cache.advance(1);
  CHECK(cache.attn_flops() == 4.0 * 4 * 30);
  // The full cache measures nothing.
  KvCache full = make_cache("full", shape);
  full.append(0, six.k.data(), six.v.data(), six.positions.data(), 6);
  full.attend(0, q);
  CHECK(full.attn_flops() == 0);
}

TEST_CASE("sparse prefill: queries=dense keeps the pattern to the context's prefill",
          "[unit][sparse_prefill]") {
  SixTokens six;
  KvShape shape;
  shape.n_layers = 1;
  shape.n_kv_heads = 1;
  shape.head_dim = 4;
  shape.n_heads = 2;
  std::vector<float> out(six.q.size());
  AttentionQuery q = six.query;
  q.out = out.data();
  // Three context tokens, then a "query" forward of the other three after end_context.
  const auto run = [&](const std::string& spec) {
    KvCache cache = make_cache(spec, shape);
    AttentionQuery first = q;
    first.n_queries = 3;
    cache.begin_forward(3);
    cache.append(0, six.k.data(), six.v.data(), six.positions.data(), 3);
    cache.attend(0, first);
    cache.advance(3);
    const double context_flops = cache.attn_flops();
    cache.end_context();
    AttentionQuery rest = q;
    rest.q += 3 * 2 * 4;  // queries 3-5: 2 heads x head_dim 4 floats each
    rest.q_positions += 3;
    rest.out += 3 * 2 * 4;
    rest.n_queries = 3;
    cache.begin_forward(3);
    cache.append(0, six.k.data() + 3 * 4, six.v.data() + 3 * 4, six.positions.data() + 3, 3);
    cache.attend(0, rest);
    cache.advance(3);
    return std::make_pair(context_flops, cache.attn_flops());
  };
  const auto sparse = run("a_shape:sink=1,local=2");
  const auto dense = run("a_shape:sink=1,local=2,queries=dense");
  CHECK(sparse.first == dense.first);  // the context's prefill reads the pattern either way
  CHECK(sparse.second > sparse.first);  // the query's forward too, by default
  CHECK(dense.second == dense.first);   // not with queries=dense: dense, not counted
  // Dense after the context means the full cache's attention there, bit for bit.
  std::vector<float> dense_out = out;
  run("full");
  CHECK(out == dense_out);
  CHECK(resolve_method_spec("a_shape").canonical == "a_shape:sink=16,local=112");
  CHECK(resolve_method_spec("minference:queries=dense").canonical ==
        "minference:last_q=64,vertical=64,slash=128,queries=dense");
}

TEST_CASE("sparse prefill: specs compose with eviction, storage and retrieval, and refuse",
          "[unit][sparse_prefill]") {
  for (const std::string ok :
       {"a_shape", "tri_shape:last=32", "minference:vertical=100,slash=200",
        "a_shape+snapkv:ratio=0.5", "tri_shape+snapkv:ratio=0.5+kivi:bits=2",
        "minference+quest:budget=256", "a_shape+fp16"}) {
    INFO(ok);
    CHECK_NOTHROW(resolve_method_spec(ok));
  }
  CHECK(resolve_method_spec("a_shape").canonical == "a_shape:sink=16,local=112");
  for (const std::string bad :
       {"full+a_shape", "a_shape+tri_shape", "a_shape+prefix", "a_shape+cacheblend",
        "adakv+snapkv:ratio=0.5+a_shape", "a_shape+duo_attention:ratio=0.5",
        "a_shape+snapkv:ratio=0.5+mikv", "minference:vertical=10", "minference:slash=20",
        "a_shape:local=0", "a_shape:sink=-1", "tri_shape:last=x", "minference:last_q=0"}) {
    INFO(bad);
    CHECK_THROWS_AS(resolve_method_spec(bad), InputError);
  }
  // On a GPU too (methods/cuda/sparse_prefill.h), composed as on the CPU.
  for (const char* spec :
       {"a_shape", "tri_shape", "minference", "tri_shape+snapkv:ratio=0.5+kivi:bits=2"}) {
    INFO(spec);
    CHECK_NOTHROW(check_runs_on(resolve_method_spec(spec), ModelDevice::Cuda));
    CHECK_NOTHROW(check_runs_on(resolve_method_spec(spec), ModelDevice::Cpu));
  }
}

TEST_CASE("sparse prefill: through the model, covering everything equals full",
          "[unit][sparse_prefill]") {
  testing::TinyLlamaSpec spec;
  spec.n_layer = 2;
  spec.context_length = 1024;
  const std::string path = testing::temp_path("tiny_sparse_prefill.gguf");
  testing::write_tiny_llama_gguf(path, spec);
  auto model = LlamaModel::load(path);
  model->prefill_chunk = 64;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 200; ++i) tokens.push_back(3 + (i * 37) % 250);
  KvCache full = make_cache("full", model->kv_shape());
  const std::vector<float> want = model->forward(tokens, full);
  KvCache all = make_cache("a_shape:sink=1000", model->kv_shape());
  const std::vector<float> got = model->forward(tokens, all);
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == want[i]);
  CHECK(all.attn_flops() == all.attn_flops_dense());
  KvCache sparse = make_cache("a_shape:sink=4,local=16", model->kv_shape());
  const std::vector<float> changed = model->forward(tokens, sparse);
  CHECK(changed != want);
  CHECK(sparse.attn_flops() < 0.5 * sparse.attn_flops_dense());
  // A sparse prefill prefills its own context: never forked from the shared dense one.
  CHECK_FALSE(SharedPrefill::can_share(resolve_method_spec("a_shape"), *model));
  CHECK(SharedPrefill::can_share(resolve_method_spec("snapkv:ratio=0.5"), *model));
}
