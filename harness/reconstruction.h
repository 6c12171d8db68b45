// KVzip's scoring forward (methods/kvzip.cpp): the model is asked to repeat the shared
// context, and the attention its answer pays to the cached context ranks each token, before
// any question is seen (query-agnostic). The prompts are the authors' (snu-mllab/KVzip
// model/wrapper.py self_task): span by span of `kReconstructionSpan` context tokens after
// the chat head,
//   first span: "\n\nRepeat the previous context exactly." + suffix + span
//   later ones: "\n\nRepeat the part of the previous context exactly, starting with "
//               + the previous span's last 8 tokens + suffix + span
// each fed through a copy of the cache (KvCache::scoring_copy) so that the sequence itself
// never holds the prompt. The forwards run inside the caller's prefill timing: they are the
// method's real cost (2-3x the prefill, as kvpress warns).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvbench {

class KvCache;
class LlamaModel;

// Context tokens one reconstruction forward repeats (the authors' chunk_size).
constexpr int64_t kReconstructionSpan = 2000;

// Runs the forwards when `cache`'s policy scores by reconstruction, else does nothing.
// `cache` holds `context` (its end not yet marked); the spans start after its first
// `head_tokens` (the chat template's head, which the method keeps); `suffix` ends the user's
// turn and opens the assistant's (the template's, "\n" without one).
void score_by_reconstruction(const LlamaModel& model, KvCache& cache,
                             const std::vector<int32_t>& context, int64_t head_tokens,
                             const std::string& suffix);

}  // namespace kvbench
