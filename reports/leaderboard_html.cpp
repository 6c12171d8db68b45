// leaderboard.html: the board's tables and charts as one self-contained page
// (reports/leaderboard.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "reports/board.h"
#include "reports/head_map.h"
#include "reports/leaderboard.h"
#include "reports/mode_comparison.h"
#include "reports/svg_charts.h"

namespace kvbench {

using namespace board;
using namespace charts;

const char* const kReportStyle = R"(body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;background:#fafafa;color:#222;margin:24px auto;max-width:1100px;padding:0 16px;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
p.note{color:#555;font-size:.9em}
table{border-collapse:collapse;margin:.6em 0;font-size:.85em;background:#fff}
th,td{border:1px solid #ddd;padding:4px 8px;vertical-align:top}
th{background:#f0f0f0;text-align:left}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.spec{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.95em;overflow-wrap:anywhere;max-width:360px}
td.nw{white-space:nowrap}
td.wide{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.95em;overflow-wrap:anywhere;min-width:180px}
tr:nth-child(even) td{background:#f8f8f8}
tr.full td{background:#eef4fb}
svg{background:#fff;border:1px solid #ddd;display:block;margin:.6em 0}
div.maps{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start}div.maps svg{margin:0}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;fill:#222}
svg .tick{font-size:11px;fill:#444}svg .axis{font-size:12px}svg .legend{font-size:12px}
svg .grid{stroke:#e6e6e6;stroke-width:1}svg .axisline{stroke:#666;stroke-width:1}
svg .ref{stroke:#222;stroke-width:1.5;stroke-dasharray:6 4}svg .ref.alt{stroke:#888;stroke-dasharray:2 3}
)";

namespace {

// Table cells. A std::string is text (from a db or not) and is escaped here; a Markup holds
// HTML this file built from escaped pieces. So no db string reaches a cell unescaped.
struct Markup {
  std::string html;
};

std::string th(const std::string& text, bool numeric = false) {
  return std::string(numeric ? "<th class=\"num\">" : "<th>") + h(text) + "</th>";
}
std::string td(const Markup& cell, const char* cls = nullptr) {
  return (cls ? std::string("<td class=\"") + cls + "\">" : std::string("<td>")) + cell.html +
         "</td>";
}
std::string td(const std::string& text, const char* cls = nullptr) { return td(Markup{h(text)}, cls); }

Markup h_spec(const std::string& spec) {
  Markup out;
  for (char c : h(spec)) {
    out.html += c;
    if (c == ',' || c == '+') out.html += "<wbr>";
  }
  return out;
}

std::string tr_open(const Row& r) { return r.is_full() ? "<tr class=\"full\">" : "<tr>"; }


}  // namespace

std::string render_leaderboard_html(const std::vector<RunRecord>& runs,
                                    const std::vector<Aggregate>& rows,
                                    const std::vector<HeadMap>& head_maps) {
  const Board b = build_board(rows);
  const Coverage c = coverage(runs);
  const FamilyColours fc(b.rows);
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<title>kvbench leaderboard</title>\n<style>\n" << kReportStyle << "</style>\n</head>\n<body>\n";
  o << "<h1>kvbench leaderboard</h1>\n";
  o << "<p>" << c.runs << " run" << (c.runs == 1 ? "" : "s");
  if (c.unfinished > 0) o << " (" << c.unfinished << " unfinished)";
  o << ", " << b.units << " units, " << b.turns << " turns; model sha256 " << h(c.model_sha)
    << "; kvbench " << h(c.version) << "; git " << h(c.git_sha) << "; "
    << (c.first.empty() ? kMissing : h(c.first)) << " to " << (c.last.empty() ? kMissing : h(c.last))
    << ".</p>\n";

  // Runs.
  o << "<table class=\"runs\">\n<tr>" << th("run", true) << th("kvbench, git")
    << th("model, sha256") << th("host") << th("started, finished") << th("command") << "</tr>\n";
  for (const RunRecord& r : runs) {
    o << "<tr>" << td(std::to_string(r.id), "num")
      << td(Markup{h(r.kvbench_version) + "<br>" + h(r.git_sha.substr(0, 12))}, "nw")
      << td(Markup{h(r.model_path) + "<br>" + h(r.model_sha256.substr(0, 12))}, "wide") << td(r.host)
      << td(Markup{h(r.started_at) + "<br>" +
                   (r.finished_at.empty() ? std::string("unfinished") : h(r.finished_at))},
            "nw")
      << td(r.command_line, "wide") << "</tr>\n";
  }
  o << "</table>\n";

  // Accuracy table.
  o << "<h2>Accuracy (%)</h2>\n<p class=\"note\">Mean score of the scored turns of each task, "
       "with its 95% interval (± half of it where it is symmetric, else its ends; Wilson's over "
       "turns, or a bootstrap over samples where a task gives partial credit); average: the "
       "mean of the task columns that have a value, its interval a bootstrap over each task's "
       "samples. The full cache first (shaded), then by average, best first.</p>\n";
  o << "<table>\n<tr>" << th("method") << th("budget") << th("mode");
  for (const std::string& t : b.tasks) o << th(t, true);
  o << th("average", true) << "</tr>\n";
  for (const Row& r : b.rows) {
    o << tr_open(r) << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num")
      << td(r.mode, "nw");
    for (const std::string& t : b.tasks) o << td(task_accuracy_cell(r, t), "num");
    o << td(Markup{"<b>" + h(accuracy_cell(r.average, r.average_ci ? &*r.average_ci : nullptr)) +
                   "</b>"},
            "num")
      << "</tr>\n";
  }
  o << "</table>\n";
  if (!c.calibrated.empty()) {
    o << "<p class=\"note\"><b>Calibration</b> of the tasks above (the full cache; without the "
         "context is the control, the same questions asked alone):</p>\n<ul>\n";
    for (const auto& [task, numbers] : c.calibrated) {
      o << "<li>" << h(task) << ": " << h(numbers) << "</li>\n";
    }
    o << "</ul>\n";
  }
  if (!c.plugins.empty()) {
    o << "<p class=\"note\"><b>Plugins</b> some of the methods above came from:</p>\n<ul>\n";
    for (const std::string& p : c.plugins) o << "<li>" << h(p) << "</li>\n";
    o << "</ul>\n";
  }
  if (!c.left_out.empty()) {
    o << "<p class=\"note\"><b>Left out</b>, because the model cannot do them with the full "
         "cache or answers them without the context (so they cannot tell methods "
         "apart):</p>\n<ul>\n";
    for (const auto& [task, why] : c.left_out) o << "<li>" << h(task) << ": " << h(why) << "</li>\n";
    o << "</ul>\n";
  }

  // Accuracy vs memory: each row at its KV bytes relative to the full cache.
  o << "<h2>Accuracy vs KV memory</h2>\n";
  {
    std::map<std::pair<std::string, std::string>, std::vector<const Row*>> rows_of;
    std::vector<std::pair<std::string, std::string>> order;  // series in first-seen order
    std::map<std::string, std::string> family_of;             // series -> its family
    std::vector<RefLine> refs;
    std::set<double> xs;
    size_t no_ratio = 0;  // scored rows without a full-cache reference: no x to draw them at
    const bool many_modes = b.modes.size() > 1;
    for (const Row& r : b.rows) {
      if (!r.average) continue;
      if (r.is_full()) {
        refs.push_back({"full cache" + (many_modes ? " (" + r.mode + ")" : std::string()) +
                            (r.budget.empty() ? "" : " " + r.budget),
                        *r.average});
        continue;
      }
      if (!r.kv_vs_ref || *r.kv_vs_ref <= 0) {
        ++no_ratio;
        continue;
      }
      auto key = std::make_pair(r.parts.series, r.mode);
      family_of[r.parts.series] = r.parts.family;
      if (!rows_of.count(key)) order.push_back(key);
      rows_of[key].push_back(&r);
      xs.insert(*r.kv_vs_ref);
    }
    // Series order: by family, then spec, then mode (stable across dbs).
    std::sort(order.begin(), order.end(), [&](const auto& a, const auto& b2) {
      return std::make_tuple(family_of[a.first], a.first, a.second) <
             std::make_tuple(family_of[b2.first], b2.first, b2.second);
    });
    std::map<std::string, std::set<std::string>> variants;  // family -> series specs
    for (const auto& k : order) variants[family_of[k.first]].insert(k.first);
    std::vector<Series> series;
    std::map<std::string, size_t> nth_of_family;  // the family's 2nd, 3rd series: dashed
    for (const auto& k : order) {
      Series se;
      const std::string fam = family_of[k.first];
      se.colour = fc.colour_of(fam);
      const size_t nth = nth_of_family[fam]++ + (fc.index_of(fam) / kPaletteSize);
      se.dash = nth == 0 ? "" : nth % 2 == 1 ? " stroke-dasharray=\"6 3\"" : " stroke-dasharray=\"2 2\"";
      se.label = variant_name(fam, k.first, variants[fam]);
      if (many_modes) se.label += " (" + k.second + ")";
      se.tooltip = k.first + " (" + k.second + ")";
      std::vector<const Row*> rows = rows_of[k];
      std::sort(rows.begin(), rows.end(),
                [](const Row* x, const Row* y) { return *x->kv_vs_ref < *y->kv_vs_ref; });
      for (const Row* r : rows) {
        se.points.push_back({*r->kv_vs_ref, *r->average});
        const Interval ci = r->average_ci.value_or(Interval{*r->average, *r->average, *r->average, 0});
        se.bounds.push_back({ci.low, ci.high});
      }
      series.push_back(std::move(se));
    }
    if (series.empty() && refs.empty()) {
      o << "<p class=\"note\">No scored rows"
        << (no_ratio ? " with " + ref_cache(b) + " on the same task and mode" : std::string())
        << ".</p>\n";
    } else {
      XAxis x;
      x.title = "KV bytes relative to " + ref_cache(b);
      x.jitter = std::min(2.0, 20.0 / static_cast<double>(std::max<size_t>(series.size(), 1)));
      if (!xs.empty()) {
        x.lo = *xs.begin();
        x.hi = *xs.rbegin();
        x.log = x.lo > 0 && x.hi / x.lo >= 4;
        for (double t : {1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0 / 2, 1.0, 2.0}) {
          if (t >= x.lo * 0.999 && t <= x.hi * 1.001) x.ticks.push_back(t);
        }
        if (x.ticks.empty()) x.ticks.assign(xs.begin(), xs.end());
        for (double t : x.ticks) x.tick_labels.push_back(ratio_label(t));
      }
      o << "<p class=\"note\">y: average accuracy over the tasks, with its 95% interval as a bar; "
           "x: the row's resident KV bytes over "
        << ref_cache(b) << "'s (" << ref_column(b) << "); one line per method "
           "(the spec without its budget), its points set a pixel or two apart so that equal values "
           "show; dashed: the full cache."
        << (x.log ? " x axis logarithmic." : "")
        << (no_ratio ? " Rows without " + ref_cache(b) + " on the same task and mode are not "
                       "drawn (no " + ref_column(b) + "); see the tables."
                     : std::string())
        << "</p>\n";
      o << line_chart("accuracy against KV memory relative to " + ref_cache(b) + " per method", x,
                      series, refs);
    }
  }

  // Cost and fidelity.
  o << "<h2>Cost and fidelity</h2>\n<p class=\"note\">Means over the tasks of each row. "
    << h(ref_sentence(b)) << " Peak: the largest over all turns. Decode tok/s: turns that decoded more than one "
       "token. Read/step: KV bytes attention read per decode step, all layers (Quest reads "
       "pages, KIVI packed blocks). Reused: prompt tokens loaded from the reuse tiers instead "
       "of prefilled (prefix). KL: first-token KL divergence from the full cache (nats); "
       "top-1: agreement of the greedy tokens with the full cache.</p>\n";
  o << "<table>\n<tr>" << th("method") << th("budget") << th("mode") << th("prefill")
    << th(ref_column(b), true)
    << th("KV MiB", true) << th("peak MiB", true) << th("read/step KiB", true)
    << th("TTFT ms", true) << th("reused %", true)
    << th("decode tok/s", true) << th("KL", true) << th("top-1 %", true) << "</tr>\n";
  for (const Row& r : b.rows) {
    o << tr_open(r) << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num")
      << td(r.mode, "nw") << td(prefill_cell(r.prefill), "nw")
      << td(r.kv_vs_ref ? fmt(*r.kv_vs_ref, 2) + "x" : std::string(kMissing), "num")
      << td(fmt(r.kv_mib, 2), "num") << td(fmt(r.peak_mib, 2), "num")
      << td(fmt(r.read_kib, 0), "num") << td(fmt(r.ttft_ms, 1), "num") << td(fmt(r.reused, 1, 100), "num") << td(fmt(r.decode, 1), "num") << td(fmt(r.kl, 4), "num")
      << td(fmt(r.top1, 1, 100), "num") << "</tr>\n";
  }
  o << "</table>\n";
  if (any_timed(b)) {
    o << "<h2>Time per unit</h2>\n<p class=\"note\">" << h(kTimeNote) << "</p>\n";
    o << "<table>\n<tr>" << th("method") << th("budget") << th("mode");
    for (const char* c : kTimeHead) o << th(c, true);
    o << "</tr>\n";
    for (const Row& r : b.rows) {
      if (r.time.timed_units == 0) continue;
      o << tr_open(r) << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num")
        << td(r.mode, "nw");
      for (const std::string& c : time_cells(r)) o << td(c, "num");
      o << "</tr>\n";
    }
    o << "</table>\n";
  }

  // Bars grouped by method family and series, budgets ascending within (full first).
  std::vector<const Row*> bar_rows;
  for (const Row& r : b.rows) bar_rows.push_back(&r);
  std::stable_sort(bar_rows.begin(), bar_rows.end(), [](const Row* x, const Row* y) {
    const auto& bx = x->parts.budget_tokens;
    const auto& by = y->parts.budget_tokens;
    return std::make_tuple(!x->is_full(), x->parts.family, x->parts.series, x->mode, !bx.has_value(),
                           bx.value_or(0), x->budget) <
           std::make_tuple(!y->is_full(), y->parts.family, y->parts.series, y->mode, !by.has_value(),
                           by.value_or(0), y->budget);
  });
  std::vector<Bar> ttft, mem;
  for (const Row* rp : bar_rows) {
    const Row& r = *rp;
    const std::string c = fc.colour_of(r.parts.family);
    ttft.push_back({r.label, r.method + " " + r.mode, c, r.ttft_ms, fmt(r.ttft_ms, 1) + " ms"});
    mem.push_back({r.label, r.method + " " + r.mode, c, r.kv_mib,
                   fmt(r.kv_mib, 2) + " MiB" +
                       (r.kv_vs_ref ? " (" + fmt(*r.kv_vs_ref, 2) + "x)" : std::string())});
  }
  o << "<h2>Time to first token</h2>\n<p class=\"note\">Mean TTFT per row, milliseconds "
       "(hover a bar for the full spec).</p>\n"
    << bar_chart("mean time to first token per method", ttft);
  o << "<h2>KV memory</h2>\n<p class=\"note\">Mean resident KV cache after a turn, MiB; in "
       "parentheses the ratio to "
    << ref_cache(b) << "'s.</p>\n"
    << bar_chart("mean KV memory per method", mem);

  // Kept tokens per layer and head: one sample, one small map per method.
  o << "<h2 id=\"kept-per-head\">Kept tokens per layer and head</h2>\n";
  if (head_maps.empty()) {
    o << "<p class=\"note\">No unit recorded its tokens per KV head (a db written before "
         "schema v5).</p>\n";
  } else {
    const HeadMap& m = head_maps.front();
    o << "<p class=\"note\">After the first turn of one sample (task " << h(m.task)
      << ", sample " << h(m.sample_id) << ", " << h(m.mode)
      << "): the tokens each KV head of each layer kept, over the tokens the cache had seen "
         "by then (context, query and first answer). Rows: layers, 0 at the top; columns: "
         "KV heads. A method whose heads keep equal counts shows uniform rows; head-wise "
         "budgets vary along a row, layer budgets down the columns. Hover a cell for its "
         "count.</p>\n<div class=\"maps\">\n";
    for (const HeadMap& map : head_maps) o << head_map_svg(map);
    o << "</div>\n";
  }

  // Accuracy by turn.
  o << "<h2>Accuracy by turn (%)</h2>\n";
  const size_t k = max_turns(b);
  if (k == 0) {
    o << "<p class=\"note\">No multi-turn rows with scores.</p>\n";
  } else {
    o << "<p class=\"note\">Multi-turn rows: mean score at each turn index over the tasks.</p>\n";
    o << "<table>\n<tr>" << th("method") << th("budget");
    for (size_t i = 1; i <= k; ++i) o << th("turn " + std::to_string(i), true);
    o << "</tr>\n";
    std::vector<Series> series;
    std::map<std::string, size_t> family_lines;  // lines drawn per family so far
    for (const Row& r : b.rows) {
      if (!is_multi_turn(r) || r.by_turn.empty()) continue;
      o << tr_open(r) << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num");
      Series se;
      se.label = r.label;  // every row here is multi-turn: no mode in the legend
      const std::string mode_suffix = " (" + r.mode + ")";
      if (se.label.size() > mode_suffix.size() &&
          se.label.compare(se.label.size() - mode_suffix.size(), mode_suffix.size(), mode_suffix) == 0) {
        se.label.erase(se.label.size() - mode_suffix.size());
      }
      se.tooltip = r.method;
      // The family's colour, as in the other charts; budgets of one family by dash.
      se.colour = fc.colour_of(r.parts.family);
      static const char* const kFamilyDash[] = {"", " stroke-dasharray=\"6 3\"",
                                                " stroke-dasharray=\"2 2\"",
                                                " stroke-dasharray=\"8 2 2 2\""};
      se.dash = kFamilyDash[family_lines[r.parts.family]++ % 4];
      for (size_t i = 0; i < k; ++i) {
        const bool has = i < r.by_turn.size() && std::isfinite(r.by_turn[i]);
        o << td(has ? fmt(r.by_turn[i] * 100, 1) : std::string(kMissing), "num");
        if (has) se.points.push_back({static_cast<double>(i + 1), r.by_turn[i]});
      }
      o << "</tr>\n";
      series.push_back(std::move(se));
    }
    o << "</table>\n";
    // More lines than the palette has colours read as spaghetti: the chart keeps the full
    // cache and the best rows (table order), the table above has them all.
    constexpr size_t kMaxLines = 12;
    if (series.size() > kMaxLines) {
      o << "<p class=\"note\">The chart shows the first " << kMaxLines << " of these "
        << series.size() << " rows (the full cache, then by average accuracy).</p>\n";
      series.resize(kMaxLines);
    }
    XAxis x;
    x.title = "turn (points of different rows are set a little apart so that equal values show)";
    x.jitter = std::min(3.0, 30.0 / static_cast<double>(std::max<size_t>(series.size(), 1)));
    x.lo = 1;
    x.hi = static_cast<double>(std::max<size_t>(k, 2));
    for (size_t i = 1; i <= k; ++i) x.ticks.push_back(static_cast<double>(i));
    o << line_chart("multi-turn accuracy by turn index", x, series, {});
  }

  const ModeComparison modes = compare_modes(rows);
  if (!modes.modes.empty()) {
    o << "<h2 id=\"modes\">Multi-turn vs multi-request</h2>\n<p class=\"note\">" << h(kModesNote)
      << "</p>\n<table>\n<tr>" << th("method") << th("budget");
    for (const std::string& m : modes.modes) o << th(m, true);
    o << "</tr>\n";
    for (const ModeComparisonRow& r : modes.rows) {
      o << (r.full ? "<tr class=\"full\">" : "<tr>")
        << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num");
      for (const ModeCell& c : r.cells) o << td(interval_cell(c.accuracy), "num");
      o << "</tr>\n";
    }
    o << "</table>\n<p class=\"note\">By turn: the k-th query of a session, or the k-th "
         "request.</p>\n<table>\n<tr>"
      << th("method") << th("budget") << th("mode");
    const size_t k = most_turns(modes);
    for (size_t i = 1; i <= k; ++i) o << th("turn " + std::to_string(i), true);
    o << "</tr>\n";
    for (const ModeComparisonRow& r : modes.rows) {
      for (size_t m = 0; m < modes.modes.size(); ++m) {
        const std::vector<Interval>& turns = r.cells[m].by_turn;
        if (turns.empty()) continue;
        o << (r.full ? "<tr class=\"full\">" : "<tr>")
          << td(h_spec(r.method), "spec") << td(budget_cell(r.budget), "num")
          << td(modes.modes[m]);
        for (size_t i = 0; i < k; ++i) {
          o << td(i < turns.size() ? interval_cell(turns[i]) : std::string(kMissing), "num");
        }
        o << "</tr>\n";
      }
    }
    o << "</table>\n";
  }
  o << "</body>\n</html>\n";
  return o.str();
}


}  // namespace kvbench
