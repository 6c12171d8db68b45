#include "reports/head_map.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

#include "reports/aggregate.h"
#include "reports/html_text.h"

namespace kvbench {

namespace {

std::string num(double v) {  // SVG coordinates
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", fraction * 100);
  return buf;
}

// Rough width of 12px sans-serif text, as leaderboard.cpp's charts reckon it.
double text_width(const std::string& s) {
  size_t chars = 0;
  for (char c : s) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return 6.8 * static_cast<double>(chars);
}

double fraction_of(int64_t kept, int64_t seen) {
  return seen > 0 ? static_cast<double>(kept) / static_cast<double>(seen) : 0.0;
}

}  // namespace

std::vector<HeadMap> first_sample_head_maps(const std::vector<UnitRecord>& units) {
  const UnitRecord* first = nullptr;  // of the task that sorts first, the first written
  for (const UnitRecord& u : units) {
    if (u.head_tokens.empty()) continue;
    if (first == nullptr || u.task < first->task) first = &u;
  }
  std::vector<HeadMap> maps;
  if (first == nullptr) return maps;
  for (const UnitRecord& u : units) {
    if (u.head_tokens.empty() || u.task != first->task || u.sample_id != first->sample_id ||
        u.mode != first->mode) {
      continue;
    }
    const bool repeated = std::any_of(maps.begin(), maps.end(),
                                      [&](const HeadMap& m) { return m.method == u.method; });
    if (repeated) continue;  // a spec twice (another seed's sample of the same id): the first
    maps.push_back(
        {u.method, u.task, u.sample_id, u.mode, u.head_tokens_seen, u.head_tokens, u.parts.family});
  }
  std::stable_sort(maps.begin(), maps.end(), [](const HeadMap& a, const HeadMap& b) {
    return std::make_tuple(a.family != "full", a.method) <
           std::make_tuple(b.family != "full", b.method);
  });
  return maps;
}

std::string kept_fraction_colour(double fraction) {
  // ColorBrewer's sequential "Blues", interpolated: lightness falls monotonically.
  static const std::array<std::array<int, 3>, 9> kStops = {{{247, 251, 255},
                                                            {222, 235, 247},
                                                            {198, 219, 239},
                                                            {158, 202, 225},
                                                            {107, 174, 214},
                                                            {66, 146, 198},
                                                            {33, 113, 181},
                                                            {8, 81, 156},
                                                            {8, 48, 107}}};
  const double f = std::isfinite(fraction) ? std::clamp(fraction, 0.0, 1.0) : 0.0;
  const double pos = f * static_cast<double>(kStops.size() - 1);
  const size_t i = std::min(static_cast<size_t>(pos), kStops.size() - 2);
  const double t = pos - static_cast<double>(i);
  char buf[8];
  int rgb[3];
  for (int c = 0; c < 3; ++c) {
    rgb[c] = static_cast<int>(std::lround(kStops[i][c] + t * (kStops[i + 1][c] - kStops[i][c])));
  }
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
  return buf;
}

std::string head_map_svg(const HeadMap& map) {
  const size_t layers = map.kept.size();
  const size_t heads = layers > 0 ? map.kept[0].size() : 0;
  // Cells sized so that a map stays small: 24 layers x 2 heads and 80 x 8 both fit.
  const double cell_w = std::clamp(160.0 / static_cast<double>(std::max<size_t>(heads, 1)), 8.0, 32.0);
  const double cell_h = std::clamp(240.0 / static_cast<double>(std::max<size_t>(layers, 1)), 3.0, 12.0);
  constexpr double kLeft = 34, kTop = 48, kLegendBar = 10, kLegendSteps = 10;
  const double grid_w = cell_w * static_cast<double>(heads);
  const double grid_h = std::max(cell_h * static_cast<double>(layers), 60.0);
  const double legend_x = kLeft + grid_w + 16;
  const std::string title = map.method + " \xC2\xB7 " + map.task + " \xC2\xB7 sample " + map.sample_id;
  constexpr size_t kMaxTitle = 58;
  const std::string shown_title = truncate_text(title, kMaxTitle);
  const double width = std::max(legend_x + kLegendBar + 70, text_width(shown_title) + 16);
  const double height = kTop + grid_h + 34;

  int64_t kept_sum = 0;
  for (const auto& row : map.kept) {
    for (int64_t k : row) kept_sum += k;
  }
  const double mean_fraction =
      layers * heads > 0 ? fraction_of(kept_sum, map.tokens_seen) / static_cast<double>(layers * heads)
                         : 0.0;

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width) << "\" height=\""
    << num(height) << "\" viewBox=\"0 0 " << num(width) << " " << num(height)
    << "\" role=\"img\" aria-label=\""
    << html_escape("kept tokens per layer and KV head: " + title) << "\">\n";
  s << "<text x=\"8\" y=\"15\" class=\"legend\">";
  if (shown_title != title) s << "<title>" << html_escape(title) << "</title>";
  s << html_escape(shown_title) << "</text>\n";
  // Head labels over the columns, layer labels beside every few rows.
  const size_t head_every = cell_w >= 14 ? 1 : 2;
  for (size_t hd = 0; hd < heads; hd += head_every) {
    s << "<text x=\"" << num(kLeft + cell_w * (static_cast<double>(hd) + 0.5)) << "\" y=\""
      << num(kTop - 5) << "\" text-anchor=\"middle\" class=\"tick\">" << hd << "</text>";
  }
  s << "<text x=\"" << num(kLeft) << "\" y=\"" << num(kTop - 19)
    << "\" class=\"tick\">KV head</text>\n";
  const size_t layer_every = std::max<size_t>(1, static_cast<size_t>(std::ceil(12.0 / cell_h)));
  for (size_t l = 0; l < layers; l += layer_every) {
    s << "<text x=\"" << num(kLeft - 4) << "\" y=\""
      << num(kTop + cell_h * (static_cast<double>(l) + 0.5) + 4)
      << "\" text-anchor=\"end\" class=\"tick\">" << l << "</text>";
  }
  s << "<text x=\"10\" y=\"" << num(kTop + grid_h / 2) << "\" text-anchor=\"middle\" "
    << "class=\"tick\" transform=\"rotate(-90 10 " << num(kTop + grid_h / 2) << ")\">layer</text>\n";
  for (size_t l = 0; l < layers; ++l) {
    for (size_t hd = 0; hd < heads; ++hd) {
      const int64_t kept = hd < map.kept[l].size() ? map.kept[l][hd] : 0;
      const double f = fraction_of(kept, map.tokens_seen);
      s << "<rect class=\"cell\" data-layer=\"" << l << "\" data-head=\"" << hd << "\" x=\""
        << num(kLeft + cell_w * static_cast<double>(hd)) << "\" y=\""
        << num(kTop + cell_h * static_cast<double>(l)) << "\" width=\"" << num(cell_w)
        << "\" height=\"" << num(cell_h) << "\" fill=\"" << kept_fraction_colour(f)
        << "\"><title>layer " << l << ", KV head " << hd << ": " << kept << " of "
        << map.tokens_seen << " tokens (" << percent(f) << ")</title></rect>";
    }
    s << "\n";
  }
  s << "<rect x=\"" << num(kLeft) << "\" y=\"" << num(kTop) << "\" width=\"" << num(grid_w)
    << "\" height=\"" << num(cell_h * static_cast<double>(layers))
    << "\" fill=\"none\" class=\"axisline\"/>\n";
  // Legend: the scale in ten steps, 1 at the top.
  const double step_h = grid_h / kLegendSteps;
  for (int i = 0; i < static_cast<int>(kLegendSteps); ++i) {
    const double f = 1.0 - (i + 0.5) / kLegendSteps;
    s << "<rect class=\"scale\" x=\"" << num(legend_x) << "\" y=\"" << num(kTop + step_h * i)
      << "\" width=\"" << num(kLegendBar) << "\" height=\"" << num(step_h) << "\" fill=\""
      << kept_fraction_colour(f) << "\"/>";
  }
  s << "\n<rect x=\"" << num(legend_x) << "\" y=\"" << num(kTop) << "\" width=\"" << num(kLegendBar)
    << "\" height=\"" << num(grid_h) << "\" fill=\"none\" class=\"axisline\"/>";
  for (const auto& [f, label] : {std::pair<double, const char*>{1.0, "1"}, {0.5, "0.5"}, {0.0, "0"}}) {
    s << "<text x=\"" << num(legend_x + kLegendBar + 4) << "\" y=\""
      << num(kTop + (1.0 - f) * grid_h + 4) << "\" class=\"tick\">" << label << "</text>";
  }
  s << "<text x=\"" << num(legend_x) << "\" y=\"" << num(kTop - 5)
    << "\" class=\"tick\">kept/seen</text>\n";
  s << "<text x=\"8\" y=\"" << num(kTop + grid_h + 22) << "\" class=\"tick\">" << map.tokens_seen
    << " tokens seen; kept " << percent(mean_fraction) << " on average</text>\n";
  s << "</svg>\n";
  return s.str();
}

}  // namespace kvbench
