// Calibration: the full cache's accuracy per (task setting, context length) for one model
// file, measured by `kvbench calibrate` and stored as JSON beside the configs
// (configs/calibration/<model>.json). A sweep with "min_full_accuracy" runs only the task
// settings the model can do: a task the model fails with the full cache tells nothing about
// a cache method, so it is left out, and the report says why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvbench {

struct CalibrationCell {
  std::string task;        // a sweep task label: "retr_kv", "multihop_vt[hops=2]"
  int64_t context_tokens = 0;
  int32_t samples = 0;     // samples x turns scored turns
  int32_t turns = 0;
  double accuracy = 0;     // mean score of the full cache, in [0, 1]
  double low = 0, high = 0;  // its 95% interval
  double seconds = 0;      // wall time of the cell (prefill and decode of every turn)
  double prefill_seconds = 0;  // of which the samples' context prefills (0: not recorded)
  // The no-context control: the same questions asked with the context removed. A task
  // measures a cache only if its answers need the context. Negative: not measured (a cell
  // from before the control).
  double no_context_accuracy = -1;
  double no_context_low = 0, no_context_high = 0;

  bool has_control() const { return no_context_accuracy >= 0; }
};

// The time a sweep's units will take, from the calibration's full-cache timings: each group
// (a sample in a mode) prefills its context once, shared by its methods, at the full
// cache's prefill time per sample; each unit (the group through one method) then costs the
// full cache's time per turn without the prefill, times its turns. Methods that prefill on
// their own, score or rebuild the cache cost more: a plan, not a promise.
struct PlannedUnits {
  std::string task;  // a calibration label
  int64_t context_tokens = 0;
  int32_t turns = 0;
  int64_t units = 0;
  int64_t groups = 0;  // the samples x modes (x query settings, gaps) the units share
  int64_t own_prefills = 0;  // units that prefill their context themselves, not from the group's
};

struct SweepEstimate {
  double seconds = 0;                // of the timed units
  int64_t timed_units = 0;
  std::vector<std::string> untimed;  // tasks without a cell at their length
};

struct Calibration {
  std::string model;         // short name, or the file name
  std::string model_sha256;  // of the GGUF file the cells were measured on
  std::string mode = "multi-turn";
  uint64_t seed = 0;
  std::vector<CalibrationCell> cells;

  // The cell of this setting, or nullptr.
  const CalibrationCell* find(const std::string& task, int64_t context_tokens) const;
  // Adds the cell, replacing one of the same setting.
  void put(const CalibrationCell& cell);
};

SweepEstimate estimate_sweep(const std::vector<PlannedUnits>& plan,
                             const Calibration& calibration);

// The calibration file of a model: configs/calibration/<name>.json in the source tree, the
// name being the short name of a known model or the file's name without .gguf.
std::string calibration_path(const std::string& model_path);

// Reads a calibration file; InputError naming the file when it is unreadable or malformed.
Calibration load_calibration(const std::string& path);
// Writes it atomically (temporary file, then rename); InputError when it cannot.
void save_calibration(const Calibration& calibration, const std::string& path);

}  // namespace kvbench
