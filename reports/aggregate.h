// Aggregates of a results db: one row per (method, task, mode, budget), averaged over
// every turn of every unit. What the leaderboard shows and the CI gate compares.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reports/intervals.h"
#include "store/results_db.h"

namespace kvbench {

// Sums of units' wall time and the sample-wide work inside it (UnitRecord).
struct UnitTime {
  int64_t timed_units = 0;
  double wall_ms = 0;
  double shared_forward_ms = 0;
  double reference_ms = 0;
  void add(const UnitTime& o) {
    timed_units += o.timed_units;
    wall_ms += o.wall_ms;
    shared_forward_ms += o.shared_forward_ms;
    reference_ms += o.reference_ms;
  }
};

struct Aggregate {
  std::string method;  // canonical spec
  // Its family ("snapkv+kivi": what the report groups and colours by), series and budget in
  // tokens, read from the db's columns (UnitRecord::parts).
  MethodParts parts;
  std::string task;
  std::string mode;    // mode_label of its units
  std::string budget;  // as in UnitRecord ("" for full)
  int64_t units = 0;
  int64_t turns = 0;
  std::optional<double> accuracy;        // mean score over scored turns, in [0, 1]
  std::optional<Interval> accuracy_ci;   // its 95% interval (reports/intervals.h)
  std::vector<std::vector<double>> unit_scores;  // scored turns of each unit (one sample)
  std::vector<double> accuracy_by_turn;  // mean score per turn index (1-based index i at [i-1])
  std::optional<double> first_token_kl;  // mean over turns with fidelity
  std::optional<double> top1_agreement;
  double ttft_ms = 0;                 // mean
  double decode_tokens_per_s = 0;     // mean over turns that decoded more than one token
  double kv_bytes = 0;                // mean resident after a turn
  int64_t kv_bytes_peak = 0;          // largest
  double kv_read_per_step = 0;        // mean over turns that decoded: bytes read per step
  std::optional<double> reused;       // reuse: prompt tokens loaded over prompt tokens (when any)
  // kv_bytes / the reference row's on the same task and mode; `reference` names that
  // method ("bf16" or "full"), the same for every row of one aggregation.
  std::optional<double> kv_vs_reference;
  std::string reference;
  // How the units' contexts went in: "dense", "stream:N", "mixed" when units differ, ""
  // when unknown (units written before schema v4); "+shared" when every unit started
  // from its sample's one prefill for all methods.
  std::string prefill;
  // Where the units' wall time went (UnitRecord::wall_ms and its parts, schema v8), summed
  // over the units that have it; timed_units 0 for a db written before.
  UnitTime time;
};

// How a unit was driven, as reports group and show it: its mode ("multi-turn",
// "multi-request"), then " query-aware" when the first query was inside the compressed span
// and " gap=30s" for simulated turn gaps; the defaults (agnostic, no gap) add nothing, so
// older dbs and baselines read as before.
std::string mode_label(const UnitRecord& unit);

// Whether a mode label is multi-turn (a session's turns over one cache).
bool is_multi_turn_mode(const std::string& label);

// Combines two units' prefill descriptions (UnitRecord::prefill, "" for the first).
std::string combine_prefill(const std::string& a, const std::string& b);

// What a row's KV bytes are measured against: the bf16 cache, the 16-bit cache the engines
// users run hold (the default), or the fp32 full cache (`--reference fp32`). The fidelity
// reference (KL, top-1) is the fp32 full cache either way.
enum class KvReference { Bf16, Fp32 };

// Parses "bf16" or "fp32"; throws InputError naming the option otherwise.
KvReference parse_kv_reference(const std::string& text);

// Sorted by task, mode, method, budget. KvReference::Bf16 falls back to the full cache
// when the units hold no `bf16` run at all (a db written before the bf16 store existed).
std::vector<Aggregate> aggregate_units(const std::vector<UnitRecord>& units,
                                       KvReference reference = KvReference::Bf16);

}  // namespace kvbench
