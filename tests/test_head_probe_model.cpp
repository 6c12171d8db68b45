// DuoAttention's training-free heads (harness/head_probe.h) on the real model: does the
// needle probe agree with itself when its texts change? Three seeds (other pass keys and
// filler) at two context lengths (36 and 72 filler sentences, about 450 and 900 tokens):
// the Spearman rank correlation of the heads' scores between every pair of the six probes.
// A probe that picks noise would not agree with itself; the figures are in docs/methods.md.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "harness/head_probe.h"
#include "harness/model/llama_model.h"
#include "model_path.h"

using namespace kvbench;

namespace {

std::vector<double> ranks(const std::vector<float>& x) {
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&x](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (size_t i = 0; i < order.size();) {  // ties share their mean rank
    size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * static_cast<double>(i + j);
    i = j + 1;
  }
  return r;
}

double spearman(const std::vector<float>& a, const std::vector<float>& b) {
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(ra.size());
  const double mean = (n - 1) / 2;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    cov += (ra[i] - mean) * (rb[i] - mean);
    va += (ra[i] - mean) * (ra[i] - mean);
    vb += (rb[i] - mean) * (rb[i] - mean);
  }
  return cov / std::sqrt(va * vb);
}

}  // namespace

TEST_CASE("head probe: its head ranking agrees with itself across seeds and lengths",
          "[model]") {
  const auto model = LlamaModel::load(testing::model_path_or_skip());
  std::vector<std::vector<float>> scores;
  for (const int sentences : {36, 72}) {
    for (const uint32_t seed : {21u, 22u, 23u}) {
      scores.push_back(probe_retrieval_heads(*model, ProbeTexts{seed, sentences}));
    }
  }
  double lowest = 1, sum = 0, same_length = 0, across = 0;
  int pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t j = i + 1; j < scores.size(); ++j) {
      const double rho = spearman(scores[i], scores[j]);
      lowest = std::min(lowest, rho);
      sum += rho;
      (i / 3 == j / 3 ? same_length : across) += rho;
      ++pairs;
    }
  }
  std::printf("head probe on %d KV heads: Spearman over %d pairs of 6 probes (3 seeds x 36 and "
              "72 filler sentences): mean %.3f, lowest %.3f; same length %.3f, across lengths "
              "%.3f\n",
              static_cast<int>(scores[0].size()), pairs, sum / pairs, lowest, same_length / 6,
              across / 9);
  // A ranking that agreed with itself by chance would sit near 0.
  CHECK(sum / pairs > 0.6);
  CHECK(lowest > 0.3);
}
