// Seeded generators of SCBench's shared-context tasks: the synthetic ones (Retr.KV,
// Retr.Prefix-Suffix, Retr.MultiHop = RULER variable tracking, Math.Find, a mix of two, and
// kvbench's docs_kv: separately cacheable documents for CacheBlend) and the natural ones cut
// from pinned corpora (niah over real prose, repoqa over real code; datasets/corpus.h),
// sized in real tokens: the context, counted with the given tokenizer, lands within 2% of
// `context_tokens`. Deterministic: the same options and seed give byte-identical samples on
// every platform (own splitmix64 PRNG, no <random> distributions).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "datasets/corpus.h"
#include "datasets/sample.h"

namespace kvbench {

class Tokenizer;

struct GeneratorOptions {
  std::string task;              // a name from task_registry()
  // Target length of each sample's context, in tokens. 512 by default: the default model
  // (SmolLM2-135M) finds a value in 512 tokens of context but hardly in 1K (README,
  // calibration); a larger model is run at longer lengths.
  int64_t context_tokens = 512;
  int32_t turns = 5;             // queries per sample (SCBench uses 5)
  int32_t samples = 1;           // samples to generate
  uint64_t seed = 0;
  // Task-specific difficulty knobs by name, values as text ("hops" -> "4"); a knob left out
  // takes its default from task_registry(). An unknown name is an InputError.
  std::map<std::string, std::string> knobs;
  // The corpora niah and repoqa are cut from; nullptr: the pinned ones (datasets/corpus.h).
  const ProseCorpus* prose = nullptr;
  const CodeCorpus* code = nullptr;
};

struct KnobInfo {
  std::string name;
  std::string default_value;
  std::string description;
};

struct TaskInfo {
  std::string name;
  std::string description;
  std::vector<KnobInfo> knobs;  // the task-specific knobs (context_tokens, turns, samples,
                                // seed apply to every task)
};

// Every generated task, in a fixed order (for `kvbench list tasks`).
const std::vector<TaskInfo>& task_registry();

// The relative tolerance of the context length: |tokens - context_tokens| <= 2%.
constexpr double kContextTolerance = 0.02;

// Generates options.samples samples. Throws InputError naming the task and knob for an
// unknown task or knob, a malformed or out-of-range value, turns more than the task can ask
// (distinct keys, question kinds, chains), or a context_tokens too small for the turns.
std::vector<Sample> generate_samples(const GeneratorOptions& options, const Tokenizer& tokenizer);

// Token count of a context as the generators measure it (encode without special parsing).
int64_t count_context_tokens(const Tokenizer& tokenizer, const std::string& text);

}  // namespace kvbench
