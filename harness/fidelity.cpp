#include "harness/fidelity.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace kvbench {

std::vector<float> log_softmax(const std::vector<float>& logits) {
  std::vector<float> out(logits.size());
  if (logits.empty()) return out;
  const double best = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (float x : logits) total += std::exp(static_cast<double>(x) - best);
  const double log_total = std::log(total);
  for (size_t i = 0; i < logits.size(); ++i) {
    out[i] = static_cast<float>(static_cast<double>(logits[i]) - best - log_total);
  }
  return out;
}

double kl_divergence(const std::vector<float>& reference_logprobs,
                     const std::vector<float>& method_logprobs) {
  if (reference_logprobs.size() != method_logprobs.size()) {
    throw std::invalid_argument("kl_divergence: vocabularies differ (" +
                                std::to_string(reference_logprobs.size()) + " vs " +
                                std::to_string(method_logprobs.size()) + ")");
  }
  double kl = 0;
  for (size_t i = 0; i < reference_logprobs.size(); ++i) {
    const double lp = reference_logprobs[i];
    if (std::isinf(lp) && lp < 0) continue;  // p_ref = 0 contributes nothing
    kl += std::exp(lp) * (lp - static_cast<double>(method_logprobs[i]));
  }
  return std::max(kl, 0.0);
}

int32_t argmax(const std::vector<float>& values) {
  if (values.empty()) return -1;
  return static_cast<int32_t>(std::max_element(values.begin(), values.end()) - values.begin());
}

double top1_agreement(const std::vector<int32_t>& reference, const std::vector<int32_t>& method) {
  const size_t n = std::max(reference.size(), method.size());
  if (n == 0) return 1.0;
  size_t same = 0;
  for (size_t i = 0; i < std::min(reference.size(), method.size()); ++i) {
    same += reference[i] == method[i];
  }
  return static_cast<double>(same) / n;
}

}  // namespace kvbench
