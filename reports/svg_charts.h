// The leaderboard page's charts as inline SVG (reports/leaderboard_html.cpp): accuracy lines
// against an x axis (memory, budget, turn), with intervals as error bars and reference
// lines, and horizontal bars. Every text that reaches the SVG is escaped here.
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "reports/board.h"

namespace kvbench::charts {

// The i-th colour of the palette (repeating past its end, every kPaletteSize).
inline constexpr size_t kPaletteSize = 10;
std::string colour(size_t i);

// One colour per method family in every chart (the full cache: dark grey), assigned in
// family order so the same db always gets the same colours.
class FamilyColours {
 public:
  explicit FamilyColours(const std::vector<board::Row>& rows) {
    std::set<std::string> families;
    for (const board::Row& r : rows) {
      if (!r.is_full()) families.insert(r.parts.family);
    }
    size_t i = 0;
    for (const std::string& f : families) index_[f] = i++;
  }
  std::string colour_of(const std::string& family) const {
    auto it = index_.find(family);
    return it == index_.end() ? "#444444" : colour(it->second);
  }
  // Families past the palette repeat its colours: they get a dash pattern as well.
  size_t index_of(const std::string& family) const {
    auto it = index_.find(family);
    return it == index_.end() ? 0 : it->second;
  }

 private:
  std::map<std::string, size_t> index_;
};

struct Series {
  std::string label;    // legend text
  std::string tooltip;  // full name
  std::string colour;
  std::string dash;     // stroke-dasharray attribute or ""
  std::vector<std::pair<double, double>> points;  // (x, y in [0, 1])
  std::vector<std::pair<double, double>> bounds;  // per point: its 95% interval; or empty
};

struct RefLine {
  std::string label;
  double y = 0;  // in [0, 1]
};

struct XAxis {
  std::string title;
  std::vector<double> ticks;  // values with a tick and label
  bool log = false;
  double lo = 0, hi = 1;
  std::vector<std::string> tick_labels;  // parallel to ticks; empty: the numbers themselves
  // Pixels between neighbouring series' points at the same x, so that equal values stay
  // visible (for a categorical axis such as the turn index); 0: none.
  double jitter = 0;
};

// A tick of the memory axis as the Cost table writes KV vs full: "1/16x" for the fractions
// budgets are set at (0.06 would hide which one), else "0.39x".
std::string ratio_label(double r);
std::string num(double v);  // an SVG coordinate

// Accuracy (0-100%) of each series against `x`, with the reference lines and a legend.
std::string line_chart(const std::string& aria, const XAxis& x, const std::vector<Series>& series,
                       const std::vector<RefLine>& refs);

struct Bar {
  std::string label, tooltip, colour;
  double value = 0;
  std::string text;  // the value as shown
};

// One bar a value, labelled, scaled to the largest.
std::string bar_chart(const std::string& aria, const std::vector<Bar>& bars);

}  // namespace kvbench::charts
