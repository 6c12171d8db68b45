#include "reports/mode_comparison.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace kvbench {

ModeComparison compare_modes(const std::vector<Aggregate>& aggregates) {
  ModeComparison out;
  std::set<std::string> modes;
  bool turn = false, request = false;
  for (const Aggregate& a : aggregates) {
    modes.insert(a.mode);
    (is_multi_turn_mode(a.mode) ? turn : request) = true;
  }
  if (!turn || !request) return out;
  out.modes.assign(modes.begin(), modes.end());
  std::stable_sort(out.modes.begin(), out.modes.end(), [](const std::string& a, const std::string& b) {
    return is_multi_turn_mode(a) && !is_multi_turn_mode(b);
  });

  // (method, budget) -> mode -> every unit's scored turns, over the tasks.
  using Key = std::tuple<bool, std::string, std::string>;  // not full first, then by spec
  std::map<Key, std::map<std::string, std::vector<std::vector<double>>>> scores;
  for (const Aggregate& a : aggregates) {
    auto& units = scores[Key(a.parts.family != "full", a.method, a.budget)][a.mode];
    units.insert(units.end(), a.unit_scores.begin(), a.unit_scores.end());
  }
  for (const auto& [key, by_mode] : scores) {
    ModeComparisonRow row;
    row.full = !std::get<0>(key);
    row.method = std::get<1>(key);
    row.budget = std::get<2>(key);
    for (const std::string& mode : out.modes) {
      ModeCell cell;
      const auto it = by_mode.find(mode);
      if (it != by_mode.end()) {
        const std::vector<std::vector<double>>& units = it->second;
        size_t turns = 0;
        for (const auto& u : units) turns = std::max(turns, u.size());
        if (turns > 0) cell.accuracy = accuracy_interval(units);
        for (size_t i = 0; i < turns; ++i) {
          std::vector<std::vector<double>> at_turn;
          for (const auto& u : units) {
            if (i < u.size()) at_turn.push_back({u[i]});
          }
          cell.by_turn.push_back(accuracy_interval(at_turn));  // each unit one sample
        }
      }
      row.cells.push_back(std::move(cell));
    }
    out.rows.push_back(std::move(row));
  }
  return out;
}

}  // namespace kvbench
