#include "reports/serving_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <tuple>

#include "reports/html_text.h"

namespace kvbench {

namespace {

// The q-quantile of `values` (nearest rank on the sorted values); 0 for none.
double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::string fixed(double v, int digits) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

std::string h(const std::string& s) { return html_escape(s); }

std::string cell(const std::string& s) { return markdown_escape(s); }

std::string series_name(const ServingPoint& p) { return p.label; }

// Colours of the series, in order of first appearance.
const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};

struct Line {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (concurrency, value)
  std::string dash;                               // "" solid
};

// A line chart against concurrency (log2 axis), y from 0 to the largest value.
std::string chart(const std::string& title, const std::string& y_title,
                  const std::vector<Line>& lines, const std::vector<std::string>& colours) {
  constexpr double kLeft = 70, kRight = 560, kTop = 30, kHeight = 240, kWidth = 900;
  double x_hi = 1, y_hi = 0;
  for (const Line& l : lines) {
    for (const auto& [x, y] : l.points) {
      x_hi = std::max(x_hi, x);
      y_hi = std::max(y_hi, y);
    }
  }
  if (y_hi <= 0) y_hi = 1;
  const double height = std::max(kTop + kHeight + 50, kTop + 20.0 * lines.size() + 30);
  const auto px = [&](double x) {
    const double f = x_hi > 1 ? std::log2(x) / std::log2(x_hi) : 0.5;
    return kLeft + 15 + f * (kRight - kLeft - 30);
  };
  const auto py = [&](double y) { return kTop + kHeight - y / y_hi * kHeight; };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << kWidth << " " << height << "\" role=\"img\" aria-label=\""
    << h(title) << "\">\n<text x=\"" << kLeft << "\" y=\"18\" class=\"legend\">" << h(title)
    << "</text>\n";
  for (int t = 0; t <= 4; ++t) {
    const double v = y_hi * t / 4;
    s << "<line x1=\"" << kLeft << "\" y1=\"" << fixed(py(v), 1) << "\" x2=\"" << kRight
      << "\" y2=\"" << fixed(py(v), 1) << "\" class=\"grid\"/><text x=\"" << kLeft - 6
      << "\" y=\"" << fixed(py(v) + 4, 1) << "\" text-anchor=\"end\" class=\"tick\">"
      << fixed(v, v >= 100 || v == 0 ? 0 : 1) << "</text>\n";
  }
  for (double c = 1; c <= x_hi; c *= 2) {
    s << "<text x=\"" << fixed(px(c), 1) << "\" y=\"" << kTop + kHeight + 16
      << "\" text-anchor=\"middle\" class=\"tick\">" << fixed(c, 0) << "</text>\n";
  }
  s << "<text x=\"" << (kLeft + kRight) / 2 << "\" y=\"" << kTop + kHeight + 36
    << "\" text-anchor=\"middle\" class=\"tick\">concurrent sessions</text>\n<text x=\"14\" y=\""
    << kTop + kHeight / 2 << "\" transform=\"rotate(-90 14 " << kTop + kHeight / 2
    << ")\" text-anchor=\"middle\" class=\"tick\">" << h(y_title) << "</text>\n";
  for (size_t i = 0; i < lines.size(); ++i) {
    const Line& l = lines[i];
    std::string path;
    for (const auto& [x, y] : l.points) {
      path += (path.empty() ? "M" : " L") + fixed(px(x), 1) + " " + fixed(py(y), 1);
    }
    s << "<path d=\"" << path << "\" fill=\"none\" stroke=\"" << colours[i] << "\" stroke-width=\"2\""
      << (l.dash.empty() ? "" : " stroke-dasharray=\"" + l.dash + "\"") << "/>\n";
    for (const auto& [x, y] : l.points) {
      s << "<circle cx=\"" << fixed(px(x), 1) << "\" cy=\"" << fixed(py(y), 1)
        << "\" r=\"3\" fill=\"" << colours[i] << "\"><title>" << h(l.name) << ": " << fixed(y, 1)
        << " at " << fixed(x, 0) << "</title></circle>\n";
    }
    const double ly = kTop + 10 + 20.0 * i;
    s << "<line x1=\"580\" y1=\"" << ly << "\" x2=\"605\" y2=\"" << ly << "\" stroke=\""
      << colours[i] << "\" stroke-width=\"2\""
      << (l.dash.empty() ? "" : " stroke-dasharray=\"" + l.dash + "\"") << "/><text x=\"612\" y=\""
      << ly + 4 << "\" class=\"legend\">" << h(truncate_text(l.name, 44)) << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace

ServingPoint serving_point(const std::vector<ServingRow>& rows) {
  ServingPoint p;
  if (rows.empty()) return p;
  p.run_id = rows[0].run_id;
  p.label = rows[0].label;
  p.method = rows[0].method;
  p.concurrency = rows[0].concurrency;
  p.pool_bytes = rows[0].pool_bytes;
  std::vector<double> ttft, itl, e2e;
  std::map<std::string, std::vector<double>> by_sample;
  double first = rows[0].start_s, last = rows[0].start_s;
  for (const ServingRow& r : rows) {
    ++p.requests;
    first = std::min(first, r.start_s);
    last = std::max(last, r.start_s + r.e2e_ms / 1000);
    by_sample[r.sample_id].push_back(r.score.value_or(0.0));
    if (!r.error.empty()) {
      ++p.failed;
      continue;
    }
    p.output_tokens += r.output_tokens;
    p.prompt_tokens += r.prompt_tokens;
    p.cached_tokens += r.cached_tokens;
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    if (r.output_tokens > 1) itl.push_back(r.itl_ms);
  }
  p.wall_s = last - first;
  if (p.wall_s > 0) {
    p.output_tokens_per_s = p.output_tokens / p.wall_s;
    p.requests_per_s = static_cast<double>(p.requests - p.failed) / p.wall_s;
  }
  p.ttft_p50_ms = quantile(ttft, 0.5);
  p.ttft_p99_ms = quantile(ttft, 0.99);
  p.itl_p50_ms = quantile(itl, 0.5);
  p.itl_p99_ms = quantile(itl, 0.99);
  p.e2e_p50_ms = quantile(e2e, 0.5);
  std::vector<std::vector<double>> scores;
  for (auto& [sample, s] : by_sample) scores.push_back(std::move(s));
  p.accuracy = accuracy_interval(scores);
  return p;
}

std::vector<ServingPoint> serving_points(const std::vector<ServingRow>& rows) {
  std::map<std::tuple<int64_t, std::string, std::string, int32_t>, std::vector<ServingRow>> groups;
  for (const ServingRow& r : rows) groups[{r.run_id, r.label, r.method, r.concurrency}].push_back(r);
  std::vector<ServingPoint> points;
  for (const auto& [key, group] : groups) points.push_back(serving_point(group));
  return points;
}

std::string render_serving_markdown(const std::vector<ServingPoint>& points) {
  if (points.empty()) return "";
  std::ostringstream o;
  o << "## Serving under load\n\n"
    << "Each user is one sample's multi-turn session sent to the server as chat requests "
       "(`kvbench load`); concurrency is the sessions in flight at once. Throughput is output "
       "tokens per second of wall time; TTFT and ITL as the client measured them; accuracy "
       "with its 95% interval (± half of it where it is symmetric, else its ends; a failed "
       "request scores 0).\n\n"
    << "| server / method | run | pool MiB | concurrency | requests | failed | out tok/s | "
       "req/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | cached % | accuracy % |\n"
    << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const ServingPoint& p : points) {
    o << "| " << cell(series_name(p)) << " | " << p.run_id << " | "
      << (p.pool_bytes > 0 ? fixed(p.pool_bytes / 1048576.0, 0) : "–") << " | " << p.concurrency
      << " | " << p.requests << " | " << p.failed << " | " << fixed(p.output_tokens_per_s, 1)
      << " | " << fixed(p.requests_per_s, 2) << " | " << fixed(p.ttft_p50_ms, 0) << " | "
      << fixed(p.ttft_p99_ms, 0) << " | " << fixed(p.itl_p50_ms, 1) << " | "
      << fixed(p.prompt_tokens > 0 ? 100.0 * p.cached_tokens / p.prompt_tokens : 0, 0) << " | "
      << percent_with_interval(p.accuracy.mean, p.accuracy) << " |\n";
  }
  return o.str();
}

std::string render_serving_html(const std::vector<ServingPoint>& points) {
  if (points.empty()) return "";
  // One line per run and server/method, in order of first appearance.
  std::vector<std::pair<int64_t, std::string>> keys;
  for (const ServingPoint& p : points) {
    const auto key = std::make_pair(p.run_id, series_name(p));
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  std::vector<std::string> colours;
  std::vector<Line> throughput, ttft, accuracy;
  for (size_t i = 0; i < keys.size(); ++i) {
    colours.push_back(kColours[i % (sizeof kColours / sizeof kColours[0])]);
    const std::string name = keys[i].second + " (run " + std::to_string(keys[i].first) + ")";
    Line t{name, {}, ""}, p50{name + " p50", {}, ""}, p99{name + " p99", {}, "5 4"}, a{name, {}, ""};
    for (const ServingPoint& p : points) {
      if (std::make_pair(p.run_id, series_name(p)) != keys[i]) continue;
      t.points.emplace_back(p.concurrency, p.output_tokens_per_s);
      p50.points.emplace_back(p.concurrency, p.ttft_p50_ms);
      p99.points.emplace_back(p.concurrency, p.ttft_p99_ms);
      a.points.emplace_back(p.concurrency, 100 * p.accuracy.mean);
    }
    throughput.push_back(t);
    ttft.push_back(p50);
    ttft.push_back(p99);
    accuracy.push_back(a);
  }
  std::vector<std::string> ttft_colours;
  for (const std::string& c : colours) ttft_colours.insert(ttft_colours.end(), {c, c});
  std::ostringstream o;
  o << "<h2>Serving under load</h2>\n<p>Each user is one sample's multi-turn session sent as "
       "chat requests (<code>kvbench load</code>); concurrency is the sessions in flight at "
       "once. Throughput is output tokens per second of wall time; TTFT as the client measured "
       "it (p50 solid, p99 dashed); accuracy of the same answers (a failed request scores 0)."
       "</p>\n"
    << chart("Output tokens per second", "tokens/s", throughput, colours)
    << chart("Time to first token (p50 solid, p99 dashed)", "ms", ttft, ttft_colours)
    << chart("Accuracy", "%", accuracy, colours);
  o << "<table>\n<tr><th>server / method</th><th>run</th><th>pool MiB</th><th>concurrency</th>"
       "<th>requests</th><th>failed</th><th>out tok/s</th><th>TTFT p50 ms</th><th>TTFT p99 ms"
       "</th><th>ITL p50 ms</th><th>accuracy %</th></tr>\n";
  for (const ServingPoint& p : points) {
    o << "<tr><td>" << h(series_name(p)) << "</td><td class=\"num\">" << p.run_id
      << "</td><td class=\"num\">"
      << (p.pool_bytes > 0 ? fixed(p.pool_bytes / 1048576.0, 0) : "–") << "</td><td class=\"num\">"
      << p.concurrency << "</td><td class=\"num\">" << p.requests << "</td><td class=\"num\">"
      << p.failed << "</td><td class=\"num\">" << fixed(p.output_tokens_per_s, 1)
      << "</td><td class=\"num\">" << fixed(p.ttft_p50_ms, 0) << "</td><td class=\"num\">"
      << fixed(p.ttft_p99_ms, 0) << "</td><td class=\"num\">" << fixed(p.itl_p50_ms, 1)
      << "</td><td class=\"num\">" << percent_with_interval(p.accuracy.mean, p.accuracy)
      << "</td></tr>\n";
  }
  o << "</table>\n";
  return o.str();
}

}  // namespace kvbench
