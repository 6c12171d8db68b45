#include "reports/aggregate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>

#include "common/input_error.h"

namespace kvbench {

namespace {

// Running sums of one (method, task, mode, budget) group.
struct Sums {
  int64_t units = 0;
  int64_t turns = 0;
  double score_sum = 0;
  int64_t scored = 0;
  std::vector<double> turn_score_sum;  // by turn index - 1
  std::vector<int64_t> turn_scored;
  std::vector<std::vector<double>> unit_scores;
  double kl_sum = 0;
  int64_t kl_n = 0;
  double top1_sum = 0;
  int64_t top1_n = 0;
  double ttft_sum = 0;
  double decode_sum = 0;
  int64_t decode_n = 0;
  double kv_sum = 0;
  int64_t kv_peak = 0;
  int64_t prompt_tokens = 0, tokens_reused = 0;
  double read_sum = 0;
  int64_t read_n = 0;
  std::string prefill;
  MethodParts parts;
  int64_t shared = 0;  // units that started from a shared prefill
  UnitTime time;
};

}  // namespace

std::string combine_prefill(const std::string& a, const std::string& b) {
  return a == b ? a : "mixed";
}

KvReference parse_kv_reference(const std::string& text) {
  if (text == "bf16") return KvReference::Bf16;
  if (text == "fp32") return KvReference::Fp32;
  throw InputError("--reference " + text + ": expected bf16 or fp32");
}

std::string mode_label(const UnitRecord& unit) {
  std::string label = unit.mode;
  if (unit.query_setting == "aware") label += " query-aware";
  if (unit.turn_gap_s > 0) {
    std::ostringstream gap;
    gap << unit.turn_gap_s;
    label += " gap=" + gap.str() + "s";
  }
  return label;
}

bool is_multi_turn_mode(const std::string& label) { return label.rfind("multi-turn", 0) == 0; }

std::vector<Aggregate> aggregate_units(const std::vector<UnitRecord>& units,
                                       KvReference reference) {
  // Keyed in the output order: task, mode, method, budget.
  using Key = std::tuple<std::string, std::string, std::string, std::string>;
  std::map<Key, Sums> groups;
  for (const UnitRecord& unit : units) {
    Sums& s = groups[Key(unit.task, mode_label(unit), unit.method, unit.budget)];
    s.parts = unit.parts;  // the same for every unit of the method
    s.prefill = s.units == 0 ? unit.prefill : combine_prefill(s.prefill, unit.prefill);
    s.shared += unit.shared_prefill ? 1 : 0;
    ++s.units;
    if (unit.wall_ms > 0) {
      s.time.add({1, unit.wall_ms, unit.shared_forward_ms, unit.reference_ms});
    }
    std::vector<double> scores;
    for (const TurnRow& t : unit.turns) {
      ++s.turns;
      if (t.score) {
        scores.push_back(*t.score);
        s.score_sum += *t.score;
        ++s.scored;
        if (t.turn >= 1) {
          const size_t i = static_cast<size_t>(t.turn) - 1;
          if (s.turn_score_sum.size() <= i) {
            s.turn_score_sum.resize(i + 1, 0.0);
            s.turn_scored.resize(i + 1, 0);
          }
          s.turn_score_sum[i] += *t.score;
          ++s.turn_scored[i];
        }
      }
      if (t.first_token_kl) {
        s.kl_sum += *t.first_token_kl;
        ++s.kl_n;
      }
      if (t.top1_agreement) {
        s.top1_sum += *t.top1_agreement;
        ++s.top1_n;
      }
      s.ttft_sum += t.ttft_ms;
      if (t.decode_tokens_per_s > 0) {
        s.decode_sum += t.decode_tokens_per_s;
        ++s.decode_n;
      }
      s.kv_sum += static_cast<double>(t.kv_bytes);
      if (t.kv_read_per_step > 0) {
        s.read_sum += static_cast<double>(t.kv_read_per_step);
        ++s.read_n;
      }
      s.kv_peak = std::max(s.kv_peak, t.kv_bytes_peak);
      s.prompt_tokens += t.prompt_tokens;
      s.tokens_reused += t.tokens_reused;
    }
    if (!scores.empty()) s.unit_scores.push_back(std::move(scores));
  }

  std::vector<Aggregate> out;
  out.reserve(groups.size());
  for (const auto& [key, s] : groups) {
    Aggregate a;
    std::tie(a.task, a.mode, a.method, a.budget) = key;
    a.parts = s.parts;
    a.units = s.units;
    a.turns = s.turns;
    a.prefill = s.prefill + (s.shared == s.units && !s.prefill.empty() ? "+shared" : "");
    a.time = s.time;
    if (s.scored > 0) {
      a.accuracy = s.score_sum / static_cast<double>(s.scored);
      a.accuracy_ci = accuracy_interval(s.unit_scores);
      a.unit_scores = s.unit_scores;
    }
    // A turn index below the largest scored one that has no score itself is NaN (the
    // renderers show it as missing); no scored turn at all leaves the vector empty.
    a.accuracy_by_turn.resize(s.turn_score_sum.size());
    for (size_t i = 0; i < s.turn_score_sum.size(); ++i) {
      a.accuracy_by_turn[i] = s.turn_scored[i] > 0
                                  ? s.turn_score_sum[i] / static_cast<double>(s.turn_scored[i])
                                  : std::numeric_limits<double>::quiet_NaN();
    }
    if (s.kl_n > 0) a.first_token_kl = s.kl_sum / static_cast<double>(s.kl_n);
    if (s.top1_n > 0) a.top1_agreement = s.top1_sum / static_cast<double>(s.top1_n);
    if (s.turns > 0) {
      a.ttft_ms = s.ttft_sum / static_cast<double>(s.turns);
      a.kv_bytes = s.kv_sum / static_cast<double>(s.turns);
    }
    if (s.decode_n > 0) a.decode_tokens_per_s = s.decode_sum / static_cast<double>(s.decode_n);
    a.kv_bytes_peak = s.kv_peak;
    if (s.read_n > 0) a.kv_read_per_step = s.read_sum / static_cast<double>(s.read_n);
    if (s.tokens_reused > 0) {
      a.reused = static_cast<double>(s.tokens_reused) / static_cast<double>(s.prompt_tokens);
    }
    out.push_back(std::move(a));
  }

  // kv_vs_reference: against the reference's row on the same task and mode (the one
  // without a budget when there are several).
  std::string ref = reference == KvReference::Bf16 ? "bf16" : "full";
  const auto is_ref = [&](const Aggregate& a) { return a.parts.family == ref; };
  if (std::none_of(out.begin(), out.end(), is_ref)) ref = "full";
  std::map<std::pair<std::string, std::string>, const Aggregate*> refs;
  for (const Aggregate& a : out) {
    if (!is_ref(a)) continue;
    auto& slot = refs[{a.task, a.mode}];
    if (slot == nullptr || (!slot->budget.empty() && a.budget.empty())) slot = &a;
  }
  std::vector<std::optional<double>> ratios(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    auto it = refs.find({out[i].task, out[i].mode});
    if (it != refs.end() && it->second->kv_bytes > 0) {
      ratios[i] = out[i].kv_bytes / it->second->kv_bytes;
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].kv_vs_reference = ratios[i];
    out[i].reference = ref;
  }
  return out;
}

}  // namespace kvbench
