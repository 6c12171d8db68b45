#include "harness/reconstruction.h"

#include <algorithm>

#include "cache/kv_cache.h"
#include "cache/policy.h"
#include "common/input_error.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"

namespace kvbench {
namespace {

constexpr int64_t kPreviousTail = 8;  // the authors' prev_postfix_size

// A piece of prompt text without the BOS a vocabulary may add to every encode.
std::vector<int32_t> encode_piece(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> ids = tokenizer.encode(text);
  const bool adds_bos = !tokenizer.encode("").empty();
  if (adds_bos && !ids.empty() && ids.front() == tokenizer.bos_id()) ids.erase(ids.begin());
  return ids;
}

}  // namespace

void score_by_reconstruction(const LlamaModel& model, KvCache& cache,
                             const std::vector<int32_t>& context, int64_t head_tokens,
                             const std::string& suffix) {
  if (!cache.policy() || !cache.policy()->scores_by_reconstruction()) return;
  const Tokenizer& tokenizer = model.tokenizer();
  const std::vector<int32_t> first =
      encode_piece(tokenizer, "\n\nRepeat the previous context exactly.");
  const std::vector<int32_t> later = encode_piece(
      tokenizer, "\n\nRepeat the part of the previous context exactly, starting with ");
  const std::vector<int32_t> suffix_ids = encode_piece(tokenizer, suffix);
  const int64_t n = static_cast<int64_t>(context.size());
  for (int64_t begin = std::min(head_tokens, n); begin < n; begin += kReconstructionSpan) {
    const int64_t end = std::min(n, begin + kReconstructionSpan);
    std::vector<int32_t> prompt = begin == head_tokens ? first : later;
    if (begin != head_tokens) {
      prompt.insert(prompt.end(), context.begin() + (begin - kPreviousTail), context.begin() + begin);
    }
    prompt.insert(prompt.end(), suffix_ids.begin(), suffix_ids.end());
    prompt.insert(prompt.end(), context.begin() + begin, context.begin() + end);
    const int64_t reach = cache.next_position() + static_cast<int64_t>(prompt.size());
    if (reach > model.config().context_length) {
      throw InputError("kvzip: repeating a context of " + std::to_string(n) + " tokens needs " +
                       std::to_string(reach) + " positions, more than the model's context of " +
                       std::to_string(model.config().context_length));
    }
    KvCache scratch = cache.scoring_copy(begin, end);
    scratch.reserve_more(static_cast<int64_t>(prompt.size()));
    model.forward(prompt, scratch);
    cache.adopt_scoring(std::move(scratch));
  }
}

}  // namespace kvbench
