// Tests name methods by their spec text; the harness takes them resolved (its entry points,
// the sweep and the command line, resolve each spec once). These resolve and run.
#pragma once

#include <string>
#include <vector>

#include "cache/registry.h"
#include "harness/evaluation.h"
#include "harness/session.h"

namespace kvbench {

inline SessionResult run_session(const LlamaModel& model, const Sample& sample,
                                 const std::string& method, const SessionOptions& options,
                                 const SampleReference* reference,
                                 const SharedPrefill* shared = nullptr) {
  return run_session(model, sample, resolve_method_spec(method), options, reference, shared);
}

inline PrefillCount evaluate(const LlamaModel& model, const std::vector<Sample>& samples,
                             const std::vector<std::string>& methods,
                             const EvaluationOptions& options, const UnitSink& sink) {
  std::vector<ResolvedSpec> specs;
  for (const std::string& method : methods) specs.push_back(resolve_method_spec(method));
  return evaluate(model, samples, specs, options, sink);
}

}  // namespace kvbench
