#include "harness/calibration.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "common/files.h"
#include "common/input_error.h"
#include "common/json_input.h"
#include "harness/model/known_models.h"

namespace kvbench {

using nlohmann::json;

const CalibrationCell* Calibration::find(const std::string& task, int64_t context_tokens) const {
  for (const CalibrationCell& c : cells) {
    if (c.task == task && c.context_tokens == context_tokens) return &c;
  }
  return nullptr;
}

void Calibration::put(const CalibrationCell& cell) {
  for (CalibrationCell& c : cells) {
    if (c.task == cell.task && c.context_tokens == cell.context_tokens) {
      c = cell;
      return;
    }
  }
  cells.push_back(cell);
}

SweepEstimate estimate_sweep(const std::vector<PlannedUnits>& plan,
                             const Calibration& calibration) {
  SweepEstimate estimate;
  for (const PlannedUnits& p : plan) {
    const CalibrationCell* cell = calibration.find(p.task, p.context_tokens);
    if (cell == nullptr || cell->samples <= 0 || cell->turns <= 0 || cell->seconds <= 0) {
      estimate.untimed.push_back(p.task + " at " + std::to_string(p.context_tokens) + " tokens");
      continue;
    }
    const double prefill = std::min(cell->prefill_seconds, cell->seconds);
    const double per_sample_prefill = prefill / cell->samples;
    const double per_turn =
        (cell->seconds - prefill) / (static_cast<double>(cell->samples) * cell->turns);
    estimate.seconds += per_sample_prefill * static_cast<double>(p.groups + p.own_prefills) +
                        per_turn * p.turns * static_cast<double>(p.units);
    estimate.timed_units += p.units;
  }
  return estimate;
}

std::string calibration_path(const std::string& model_path) {
  std::string name = known_model_name(model_path);
  if (name.empty()) name = std::filesystem::path(model_path).stem().string();
  return std::string(KVBENCH_SOURCE_DIR) + "/configs/calibration/" + name + ".json";
}

namespace {

// An accuracy and its 95% interval: 0 <= low <= accuracy <= high <= 1, up to rounding (a
// Wilson bound at 0% computes as 1.4e-17).
void check_interval(const std::string& path, const char* name, double accuracy, double low,
                    double high, const std::string& where) {
  constexpr double kSlack = 1e-9;
  if (!(0 <= low + kSlack && low <= accuracy + kSlack && accuracy <= high + kSlack &&
        high <= 1 + kSlack && accuracy >= 0 && accuracy <= 1)) {
    throw InputError(path + ": malformed calibration file (" + name +
                     " must lie in its interval [low, high] within [0, 1])" + where);
  }
}

}  // namespace

Calibration load_calibration(const std::string& path) {
  std::error_code missing;
  if (!std::filesystem::exists(path, missing)) {
    throw InputError(path + ": cannot read the calibration file (run kvbench calibrate)");
  }
  const std::string text = read_regular_file(path, "calibration file", uint64_t{16} << 20);
  // nlohmann casts a float to an integer unchecked (undefined out of range): counts are
  // checked to be integers first.
  const auto count = [&path](const json& v, const char* key) {
    const json& x = v.at(key);
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > (int64_t{1} << 30)) {
      throw InputError(path + ": malformed calibration file (" + key +
                       " must be an integer in [0, 2^30])");
    }
    return x.get<int64_t>();
  };
  try {
    const json root = parse_json_input(text, path);
    Calibration c;
    c.model = root.at("model").get<std::string>();
    c.model_sha256 = root.at("model_sha256").get<std::string>();
    c.mode = root.at("mode").get<std::string>();
    if (c.mode != "multi-turn") {
      throw InputError(path + ": malformed calibration file (mode '" + c.mode +
                       "': kvbench calibrate measures multi-turn only)");
    }
    if (!root.at("seed").is_number_unsigned()) {
      throw InputError(path + ": malformed calibration file (seed must be an unsigned integer)");
    }
    c.seed = root.at("seed").get<uint64_t>();
    for (const json& cell : root.at("cells")) {
      CalibrationCell x;
      x.task = cell.at("task").get<std::string>();
      x.context_tokens = count(cell, "context_tokens");
      x.samples = static_cast<int32_t>(count(cell, "samples"));
      x.turns = static_cast<int32_t>(count(cell, "turns"));
      x.accuracy = cell.at("accuracy").get<double>();
      x.low = cell.at("low").get<double>();
      x.high = cell.at("high").get<double>();
      const std::string where = " (cell " + x.task + " at " + std::to_string(x.context_tokens) +
                                " tokens)";
      check_interval(path, "accuracy", x.accuracy, x.low, x.high, where);
      x.seconds = cell.value("seconds", 0.0);
      x.prefill_seconds = cell.value("prefill_seconds", 0.0);
      if (cell.contains("no_context")) {
        const json& control = cell.at("no_context");
        x.no_context_accuracy = control.at("accuracy").get<double>();
        x.no_context_low = control.at("low").get<double>();
        x.no_context_high = control.at("high").get<double>();
        check_interval(path, "no_context accuracy", x.no_context_accuracy, x.no_context_low,
                       x.no_context_high, where);
      }
      if (c.find(x.task, x.context_tokens)) {
        throw InputError(path + ": malformed calibration file (a second cell for " + x.task +
                         " at " + std::to_string(x.context_tokens) + " tokens)");
      }
      for (const double s : {x.seconds, x.prefill_seconds}) {
        if (!(s >= 0 && s < 1e9)) {
          throw InputError(path + ": malformed calibration file (seconds must be in [0, 1e9))" +
                           where);
        }
      }
      c.cells.push_back(x);
    }
    return c;
  } catch (const json::exception& e) {
    throw InputError(path + ": malformed calibration file (" + std::string(e.what()) + ")");
  }
}

void save_calibration(const Calibration& c, const std::string& path) {
  json cells = json::array();
  for (const CalibrationCell& x : c.cells) {
    json cell = {{"task", x.task},         {"context_tokens", x.context_tokens},
                 {"samples", x.samples},   {"turns", x.turns},
                 {"accuracy", x.accuracy}, {"low", x.low},
                 {"high", x.high},         {"seconds", x.seconds}};
    if (x.prefill_seconds > 0) cell["prefill_seconds"] = x.prefill_seconds;
    if (x.has_control()) {
      cell["no_context"] = {{"accuracy", x.no_context_accuracy},
                            {"low", x.no_context_low},
                            {"high", x.no_context_high}};
    }
    cells.push_back(std::move(cell));
  }
  const json root = {{"model", c.model},       {"model_sha256", c.model_sha256},
                     {"mode", c.mode},         {"seed", c.seed},
                     {"cells", cells}};
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  write_file_atomically(path, dump_json(root, 1) + "\n", "calibration file");
}

}  // namespace kvbench
