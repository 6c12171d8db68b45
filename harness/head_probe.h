// Which KV heads retrieve from far back in the context, found training-free with a needle
// probe of the model: what duo_attention ranks its heads by (KvShape::head_retrieval), in
// place of the gates the DuoAttention authors learn.
#pragma once

#include <string>
#include <vector>

#include "harness/model/llama_model.h"

namespace kvbench {

struct ResolvedSpec;
class Tokenizer;

// [n_layers * n_kv_heads] scores, higher more retrieval-like. Four generated contexts of
// about 265 tokens (filler sentences with a pass key at depths 20%, 40%, 60%, 80%; fixed
// seed), each followed by the question and the teacher-forced answer: a KV head scores the
// attention mass its query heads (their mean) put on the pass-key sentence from the rows
// that read out the answer, averaged over the rows and the probes. Deterministic; CPU only.
// `seed` and `filler_sentences` vary the probe's texts (its pass keys and filler; 36 filler
// sentences are about 265 tokens with the Qwen2.5 and SmolLM2 tokenizers), to measure how
// far the ranking depends on them (docs/methods.md, "DuoAttention"), or to probe at the
// length a sweep runs (`kvbench probe-heads`); duo_attention uses the defaults.
struct ProbeTexts {
  uint32_t seed = 21;
  int filler_sentences = 36;
};
std::vector<float> probe_retrieval_heads(const LlamaModel& model, const ProbeTexts& texts = {});

// The probes' mean length in tokens (context, question and answer), and the filler sentences
// that make them about `context_tokens` long: the probe at the length a sweep runs
// (`kvbench probe-heads --context-tokens`).
int64_t probe_context_tokens(const Tokenizer& tokenizer, const ProbeTexts& texts);
int filler_sentences_for(const Tokenizer& tokenizer, int64_t context_tokens, uint32_t seed);

// The scores in the DuoAttention authors' gate format (full_attention_heads.tsv: one line per
// layer, a tab-separated value per KV head), which duo_attention:pattern=FILE reads back and
// ranks the same way.
std::string head_scores_tsv(const std::vector<float>& scores, int32_t n_layers,
                            int32_t n_kv_heads);

// The probe's scores for the model file at `model_path`, from the cache file
// $XDG_CACHE_HOME/kvbench/heads/<sha256 of the file>.json (~/.cache when unset), else probed
// and saved there (atomically; a cache that cannot be written is only a warning). The file
// is read as any input: anything but a regular file there (a FIFO, a device) is an
// InputError naming it; a torn or foreign one is probed again and replaced.
std::vector<float> cached_retrieval_heads(const LlamaModel& model, const std::string& model_path);

// Gives `model` its heads' scores when a spec needs them (MethodInfo::needs_head_retrieval,
// and no `pattern` file of learned gates given) and it has none yet, so every cache built
// from model.kv_shape() carries them.
void prepare_head_retrieval(LlamaModel& model, const std::string& model_path,
                            const std::vector<ResolvedSpec>& specs);

}  // namespace kvbench
