// Fidelity of a cache method against the full cache on the same turn: the first answer
// token's distribution (KL divergence) and greedy agreement under teacher forcing.
#pragma once

#include <cstdint>
#include <vector>

namespace kvbench {

// log(softmax(logits)), computed in double (max-shifted), stored as float.
std::vector<float> log_softmax(const std::vector<float>& logits);

// KL(reference || method) = sum_i p_ref(i) * (log p_ref(i) - log p_method(i)), in double,
// from two log-probability vectors of the same length. Never negative (float rounding of
// identical inputs gives exactly 0).
double kl_divergence(const std::vector<float>& reference_logprobs,
                     const std::vector<float>& method_logprobs);

// Index of the largest value (the first one on ties); -1 for an empty vector.
int32_t argmax(const std::vector<float>& values);

// Fraction of positions i < min(size) where reference[i] == method[i]; positions past the
// shorter one count as disagreements (the lengths differ only if the inputs do). 1.0 when
// both are empty.
double top1_agreement(const std::vector<int32_t>& reference, const std::vector<int32_t>& method);

}  // namespace kvbench
