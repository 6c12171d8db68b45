#include "harness/evaluation.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "cache/registry.h"
#include "harness/shared_prefill.h"
#include "tasks/task_catalog.h"

namespace kvbench {

namespace {

SessionOptions options_for(const Sample& sample, const EvaluationOptions& options) {
  SessionOptions session = options.session;
  if (session.max_new_tokens <= 0) {
    session.max_new_tokens = sample.task.empty() ? 64 : max_new_tokens_for(sample);
  }
  return session;
}

}  // namespace

std::vector<double> score_session(const Sample& sample, const SessionResult& session) {
  std::vector<double> scores;
  if (sample.task.empty()) return scores;
  for (const TurnRecord& turn : session.turns) {
    scores.push_back(score_turn(sample, sample.turns[static_cast<size_t>(turn.turn - 1)],
                                turn.prediction));
  }
  return scores;
}

void check_samples_fit(const LlamaModel& model, const std::vector<Sample>& samples,
                       const EvaluationOptions& options) {
  for (const Sample& sample : samples) {
    check_session_fits(model, sample, options_for(sample, options));
  }
}

PrefillCount evaluate(const LlamaModel& model, const std::vector<Sample>& samples,
                      const std::vector<ResolvedSpec>& specs, const EvaluationOptions& options,
                      const UnitSink& sink) {
  check_samples_fit(model, samples, options);
  const ResolvedSpec& full_spec = full_cache_spec();
  std::vector<ResolvedSpec> sharing;
  if (options.shared_prefill) {
    if (options.fidelity) sharing.push_back(full_spec);
    for (const ResolvedSpec& spec : specs) {
      const bool listed = std::any_of(sharing.begin(), sharing.end(), [&](const ResolvedSpec& s) {
        return s.canonical == spec.canonical;
      });
      if (!listed && SharedPrefill::can_share(spec, model)) sharing.push_back(spec);
    }
  }
  PrefillCount count;
  for (const Sample& sample : samples) {
    const SessionOptions session = options_for(sample, options);
    std::optional<SharedPrefill> shared;
    if (!sharing.empty()) {
      shared.emplace(model, session_context_tokens(model, sample, session), sharing);
      ++count.shared_prefills;
      count.shared_tokens += shared->context_tokens();
    }
    const SharedPrefill* prefill = shared ? &*shared : nullptr;
    double shared_forward_ms = shared ? shared->forward_ms() : 0;
    std::optional<SessionResult> full;  // the reference, shared by every method
    double reference_ms = 0;
    if (options.fidelity) {
      const auto start = std::chrono::steady_clock::now();
      full = run_session(model, sample, full_spec, session, nullptr, prefill);
      reference_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      count.unit_tokens += full->prefilled_tokens;
    }
    for (const ResolvedSpec& spec : specs) {
      UnitResult unit;
      unit.sample = &sample;
      // The sample's shared work is in the first unit's wall time.
      unit.shared_forward_ms = std::exchange(shared_forward_ms, 0);
      if (spec.is_full() && full) {
        reference_ms = 0;  // the unit's own session
        unit.session = *full;
      } else {
        unit.reference_ms = std::exchange(reference_ms, 0);
        unit.session = run_session(model, sample, spec, session, nullptr, prefill);
        count.unit_tokens += unit.session.prefilled_tokens;
      }
      if (full) apply_reference(unit.session, reference_of(*full));
      unit.scores = score_session(sample, unit.session);
      sink(unit);
    }
  }
  return count;
}

}  // namespace kvbench
