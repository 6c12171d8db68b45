// Evaluation: samples through cache methods, each turn scored by its task. For every
// sample the context is prefilled once for every method that can start from that prefill
// (harness/shared_prefill.h), the full cache runs first, once, as the fidelity reference
// of every method; then each method runs the sample and the finished (sample, method) unit goes to a sink: what
// `kvbench run` and `kvbench session` print, and what a results store writes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "datasets/sample.h"
#include "harness/session.h"

namespace kvbench {

class LlamaModel;

struct EvaluationOptions {
  SessionOptions session;  // session.max_new_tokens 0: each sample's task decides
                           // (max_new_tokens_for), 64 for a sample with no task
  bool fidelity = true;    // run the full-cache reference and fill KL / top-1
  // Prefill each sample's context once for every method that can start from it
  // (harness/shared_prefill.h); false: each unit prefills its own, as before.
  bool shared_prefill = true;
};

// What an evaluation prefilled: the shared prefills, and what the units ran themselves.
struct PrefillCount {
  int64_t shared_prefills = 0;
  int64_t shared_tokens = 0;  // context tokens of the shared prefills
  int64_t unit_tokens = 0;    // context tokens the units prefilled themselves
  int64_t total() const { return shared_tokens + unit_tokens; }
};

// One finished (sample, method) unit.
struct UnitResult {
  const Sample* sample = nullptr;
  SessionResult session;
  std::vector<double> scores;  // per run turn, by the turn's task; empty when the sample
                               // has no task (a plain JSONL file)
  // Work for the whole sample done just before this unit, on its sample's first unit only
  // (UnitRecord): the shared forward (every sharing method's observers in it) and the full
  // cache's reference session when it is not this unit's own.
  double shared_forward_ms = 0;
  double reference_ms = 0;
};

using UnitSink = std::function<void(const UnitResult&)>;

// Runs every sample through every method in order, sample by sample. Checks that every
// sample fits the model's context before running any (InputError naming the sample).
// Returns what was prefilled.
PrefillCount evaluate(const LlamaModel& model, const std::vector<Sample>& samples,
                      const std::vector<ResolvedSpec>& methods, const EvaluationOptions& options,
                      const UnitSink& sink);

// Throws the InputError (naming the sample) for the first sample whose context and turns
// cannot fit the model's context length.
void check_samples_fit(const LlamaModel& model, const std::vector<Sample>& samples,
                       const EvaluationOptions& options);

// The per-turn scores of a session over `sample` (empty when the sample has no task).
std::vector<double> score_session(const Sample& sample, const SessionResult& session);

}  // namespace kvbench
