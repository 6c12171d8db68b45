#include "reports/svg_charts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "reports/html_text.h"

namespace kvbench::charts {

using board::fmt;
using board::h;
using board::truncate;

namespace {

const char* const kPalette[kPaletteSize] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

}  // namespace

std::string colour(size_t i) { return kPalette[i % kPaletteSize]; }

std::string num(double v) {  // SVG coordinates
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

namespace {

// Text that may be long: truncated to `n` characters, the whole of it in a tooltip.
std::string svg_label(const std::string& text, size_t n) {
  const std::string t = truncate(text, n);
  if (t == text) return h(text);
  return "<title>" + h(text) + "</title>" + h(t);
}

constexpr double kWidth = 900;
constexpr double kPlotLeft = 60, kPlotRight = 560, kPlotTop = 20, kPlotHeight = 260;
constexpr double kLegendX = 580;

// Rough width of 12px sans-serif text (no font metrics in here): 6.8px a character.
double text_width(const std::string& s, double per_char = 6.8) {
  size_t chars = 0;
  for (char c : s) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return per_char * static_cast<double>(chars);
}

}  // namespace

// A tick of the memory axis as the Cost table writes KV vs full: "1/16x" for the fractions
// budgets are set at (0.06 would hide which one), else "0.39x".
std::string ratio_label(double r) {
  if (r > 0 && r < 1) {
    const double inv = 1 / r;
    if (std::abs(inv - std::round(inv)) < 1e-9) {
      return "1/" + std::to_string(static_cast<long long>(std::round(inv))) + "x";
    }
  }
  return fmt(r, r == std::floor(r) ? 0 : 2) + "x";
}

std::string line_chart(const std::string& aria, const XAxis& x, const std::vector<Series>& series,
                       const std::vector<RefLine>& refs) {
  const size_t legend_items = series.size() + refs.size();
  const double height =
      std::max(kPlotTop + kPlotHeight + 50, kPlotTop + 20.0 * static_cast<double>(legend_items) + 20);
  const double bottom = kPlotTop + kPlotHeight;
  auto px = [&](double v) {
    double lo = x.lo, hi = x.hi;
    if (x.log) {
      v = std::log2(v);
      lo = std::log2(lo);
      hi = std::log2(hi);
    }
    const double f = hi > lo ? (v - lo) / (hi - lo) : 0.5;
    return kPlotLeft + 15 + f * (kPlotRight - kPlotLeft - 30);
  };
  auto py = [&](double v) { return bottom - v * kPlotHeight; };

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(kWidth) << "\" height=\""
    << num(height) << "\" viewBox=\"0 0 " << num(kWidth) << " " << num(height)
    << "\" role=\"img\" aria-label=\"" << h(aria) << "\">\n";
  // Grid and y axis: 0..100 %.
  for (int t = 0; t <= 100; t += 20) {
    const double y = py(t / 100.0);
    s << "<line x1=\"" << num(kPlotLeft) << "\" y1=\"" << num(y) << "\" x2=\"" << num(kPlotRight)
      << "\" y2=\"" << num(y) << "\" class=\"grid\"/>"
      << "<text x=\"" << num(kPlotLeft - 6) << "\" y=\"" << num(y + 4)
      << "\" text-anchor=\"end\" class=\"tick\">" << t << "</text>\n";
  }
  s << "<text x=\"14\" y=\"" << num(kPlotTop + kPlotHeight / 2)
    << "\" text-anchor=\"middle\" class=\"axis\" transform=\"rotate(-90 14 "
    << num(kPlotTop + kPlotHeight / 2) << ")\">accuracy (%)</text>\n";
  // x axis: ticks at the given values, labels thinned so they do not overlap.
  s << "<line x1=\"" << num(kPlotLeft) << "\" y1=\"" << num(bottom) << "\" x2=\"" << num(kPlotRight)
    << "\" y2=\"" << num(bottom) << "\" class=\"axisline\"/>\n";
  double last_label = -1e9;
  for (size_t i = 0; i < x.ticks.size(); ++i) {
    const double t = x.ticks[i];
    const double xp = px(t);
    s << "<line x1=\"" << num(xp) << "\" y1=\"" << num(bottom) << "\" x2=\"" << num(xp)
      << "\" y2=\"" << num(bottom + 5) << "\" class=\"axisline\"/>";
    if (xp - last_label >= 40) {
      s << "<text x=\"" << num(xp) << "\" y=\"" << num(bottom + 18)
        << "\" text-anchor=\"middle\" class=\"tick\">"
        << (i < x.tick_labels.size() ? h(x.tick_labels[i]) : fmt(t, t == std::floor(t) ? 0 : 2))
        << "</text>";
      last_label = xp;
    }
    s << "\n";
  }
  s << "<text x=\"" << num((kPlotLeft + kPlotRight) / 2) << "\" y=\"" << num(bottom + 38)
    << "\" text-anchor=\"middle\" class=\"axis\">" << h(x.title) << "</text>\n";

  double ly = kPlotTop + 6;
  for (size_t i = 0; i < refs.size(); ++i) {
    const RefLine& r = refs[i];
    const std::string cls = i % 2 == 0 ? "ref" : "ref alt";
    const double y = py(r.y);
    s << "<line x1=\"" << num(kPlotLeft) << "\" y1=\"" << num(y) << "\" x2=\"" << num(kPlotRight)
      << "\" y2=\"" << num(y) << "\" class=\"" << cls << "\"><title>" << h(r.label) << ": "
      << fmt(r.y * 100, 1) << "%</title></line>\n";
    s << "<line x1=\"" << num(kLegendX) << "\" y1=\"" << num(ly) << "\" x2=\"" << num(kLegendX + 22)
      << "\" y2=\"" << num(ly) << "\" class=\"" << cls << "\"/><text x=\"" << num(kLegendX + 28)
      << "\" y=\"" << num(ly + 4) << "\" class=\"legend\">" << svg_label(r.label + " (" + fmt(r.y * 100, 1) + ")", 44)
      << "</text>\n";
    ly += 20;
  }
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& se = series[i];
    const std::string& c = se.colour;
    const double shift =
        x.jitter * (static_cast<double>(i) - static_cast<double>(series.size() - 1) / 2);
    auto pxs = [&](double v) { return px(v) + shift; };
    s << "<g><title>" << h(se.tooltip) << "</title>";
    if (se.points.size() > 1) {
      s << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"2\"" << se.dash
        << " points=\"";
      for (size_t p = 0; p < se.points.size(); ++p) {
        s << (p ? " " : "") << num(pxs(se.points[p].first)) << "," << num(py(se.points[p].second));
      }
      s << "\"/>";
    }
    for (size_t p = 0; p < se.points.size(); ++p) {
      const auto& [xv, yv] = se.points[p];
      if (p < se.bounds.size()) {  // the error bar: the point's 95% interval
        s << "<line class=\"err\" x1=\"" << num(pxs(xv)) << "\" y1=\"" << num(py(se.bounds[p].first))
          << "\" x2=\"" << num(pxs(xv)) << "\" y2=\"" << num(py(se.bounds[p].second))
          << "\" stroke=\"" << c << "\" stroke-width=\"1.2\"/>";
      }
      s << "<circle cx=\"" << num(pxs(xv)) << "\" cy=\"" << num(py(yv)) << "\" r=\"3.5\" fill=\""
        << c << "\"/>";
    }
    s << "</g>\n";
    s << "<line x1=\"" << num(kLegendX) << "\" y1=\"" << num(ly) << "\" x2=\"" << num(kLegendX + 22)
      << "\" y2=\"" << num(ly) << "\" stroke=\"" << c << "\" stroke-width=\"2\"" << se.dash
      << "/><circle cx=\"" << num(kLegendX + 11) << "\" cy=\"" << num(ly) << "\" r=\"3.5\" fill=\""
      << c << "\"/><text x=\"" << num(kLegendX + 28) << "\" y=\"" << num(ly + 4)
      << "\" class=\"legend\">" << svg_label(se.label, 44) << "</text>\n";
    ly += 20;
  }
  s << "</svg>\n";
  return s.str();
}


std::string bar_chart(const std::string& aria, const std::vector<Bar>& bars) {
  constexpr size_t kMaxLabel = 52;
  constexpr double row = 22, top = 10;
  // Labels get the room the longest needs (within limits); values after the bars fit in.
  double label_w = 60, value_w = 40;
  for (const Bar& b : bars) {
    label_w = std::max(label_w, text_width(truncate(b.label, kMaxLabel)));
    value_w = std::max(value_w, text_width(b.text, 6.2));
  }
  const double left = std::min(label_w, 360.0) + 16;
  const double right = kWidth - value_w - 16;
  const double height = top * 2 + row * static_cast<double>(bars.size());
  double hi = 0;
  for (const Bar& b : bars) hi = std::max(hi, b.value);
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(kWidth) << "\" height=\""
    << num(height) << "\" viewBox=\"0 0 " << num(kWidth) << " " << num(height)
    << "\" role=\"img\" aria-label=\"" << h(aria) << "\">\n";
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const double y = top + row * static_cast<double>(i);
    const double w = hi > 0 ? b.value / hi * (right - left) : 0;
    s << "<g><title>" << h(b.tooltip) << ": " << h(b.text) << "</title>"
      << "<text x=\"" << num(left - 8) << "\" y=\"" << num(y + 15)
      << "\" text-anchor=\"end\" class=\"legend\">" << h(truncate(b.label, kMaxLabel)) << "</text>"
      << "<rect x=\"" << num(left) << "\" y=\"" << num(y + 3) << "\" width=\"" << num(std::max(w, 1.0))
      << "\" height=\"" << num(row - 6) << "\" fill=\"" << b.colour << "\"/>"
      << "<text x=\"" << num(left + w + 6) << "\" y=\"" << num(y + 15) << "\" class=\"tick\">"
      << h(b.text) << "</text></g>\n";
  }
  s << "<line x1=\"" << num(left) << "\" y1=\"" << num(top) << "\" x2=\"" << num(left)
    << "\" y2=\"" << num(height - top) << "\" class=\"axisline\"/>\n";
  s << "</svg>\n";
  return s.str();
}


}  // namespace kvbench::charts
