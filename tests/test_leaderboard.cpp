// The leaderboard: aggregation (exact means), the Markdown golden file, escaping of hostile
// db strings in both renderers, a self-contained and balanced HTML page.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <sqlite3.h>
#include <unistd.h>

#include "common/input_error.h"
#include "reports/aggregate.h"
#include "reports/head_map.h"
#include "reports/leaderboard.h"
#include "reports/mode_comparison.h"

using namespace kvbench;

namespace {

TurnRow turn(int32_t index, std::optional<double> score, double ttft, double decode,
             int64_t kv, int64_t peak, std::optional<double> kl = std::nullopt,
             std::optional<double> top1 = std::nullopt) {
  TurnRow t;
  t.turn = index;
  t.score = score;
  t.ttft_ms = ttft;
  t.decode_tokens_per_s = decode;
  t.kv_bytes = kv;
  t.kv_bytes_peak = peak;
  t.kv_read_per_step = kv / 2;
  t.first_token_kl = kl;
  t.top1_agreement = top1;
  return t;
}

UnitRecord unit(const std::string& task, const std::string& method, const std::string& budget,
                const std::string& mode, std::vector<TurnRow> turns) {
  UnitRecord u;
  u.task = task;
  u.method = method;
  u.parts = stored_method_parts(method);  // as the db reads them back
  u.budget = budget;
  u.mode = mode;
  u.sample_id = "s";
  u.key = task + "|" + method + "|" + mode;
  u.turns = std::move(turns);
  return u;
}


std::vector<RunRecord> fixed_runs() {
  RunRecord r1;
  r1.id = 1;
  r1.kvbench_version = "0.1.0";
  r1.git_sha = "0123456789abcdef0123456789abcdef01234567";
  r1.model_path = "/models/SmolLM2-135M-Instruct-Q8_0.gguf";
  r1.model_sha256 = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
  r1.host = "node1";
  r1.command_line = "kvbench sweep sweep.json --db r.sqlite --shard 0/2";
  r1.started_at = "2025-01-02T10:00:00Z";
  r1.finished_at = "2025-01-02T11:30:00Z";
  RunRecord r2 = r1;
  r2.id = 2;
  r2.command_line = "kvbench sweep sweep.json --db r.sqlite --shard 1/2";
  r2.started_at = "2025-01-02T10:05:00Z";
  r2.finished_at = "2025-01-03T08:00:00Z";
  return {r1, r2};
}

// 3 methods (full, snapkv, h2o) x 2 tasks x 2 budgets, 3 turns a unit, plus one
// multi-request row; numbers chosen so every mean is exact in decimal.
std::vector<UnitRecord> fixed_units() {
  const std::string snap = "snapkv:budget=", snap_rest = ",window=32,kernel=5,pool=avg";
  const std::string h2o = "h2o:budget=", h2o_rest = ",recent=0.5";
  const int64_t mib = 1024 * 1024;
  std::vector<UnitRecord> u;
  for (const std::string task : {"retr_kv", "multihop_vt"}) {
    const double t = task == "retr_kv" ? 0 : 1;  // task offset
    u.push_back(unit(task, "full", "", "multi-turn",
                     {turn(1, 1.0, 40 + t, 50, 8 * mib, 9 * mib),
                      turn(2, 1.0, 20, 50, 8 * mib, 9 * mib),
                      turn(3, t ? 0.5 : 1.0, 20, 50, 8 * mib, 10 * mib)}));
    for (int64_t budget : {128, 256}) {
      const double f = budget == 128 ? 0.5 : 1.0;
      const std::string b = "budget=" + std::to_string(budget);
      u.push_back(unit(task, snap + std::to_string(budget) + snap_rest, b, "multi-turn",
                       {turn(1, f, 30, 60, budget * mib / 64, budget * mib / 32, 0.125 * f, 1.0),
                        turn(2, t ? 0.0 : f, 15, 60, budget * mib / 64, budget * mib / 32,
                             0.25, 0.75),
                        turn(3, 0.5 * f, 15, 0, budget * mib / 64, budget * mib / 32)}));
      u.push_back(unit(task, h2o + std::to_string(budget) + h2o_rest, b, "multi-turn",
                       {turn(1, 0.5 * f, 35, 55, budget * mib / 32, budget * mib / 16, 0.5, 0.5),
                        turn(2, 0.25, 15, 55, budget * mib / 32, budget * mib / 16),
                        turn(3, std::nullopt, 25, 55, budget * mib / 32, budget * mib / 16)}));
    }
  }
  u.push_back(unit("retr_kv", "full", "", "multi-request",
                   {turn(1, 1.0, 40, 50, 4 * mib, 4 * mib), turn(2, 0.0, 42, 50, 4 * mib, 4 * mib)}));
  u.push_back(unit("retr_kv", snap + "128" + snap_rest, "budget=128", "multi-request",
                   {turn(1, 0.5, 30, 60, mib, mib), turn(2, 0.0, 32, 60, mib, mib)}));
  // How the contexts went in: shared dense prefills, but H2O streamed in one task (mixed).
  for (UnitRecord& unit : u) {
    const bool h2o_streamed = unit.method.rfind("h2o", 0) == 0 && unit.task == "retr_kv";
    unit.prefill = h2o_streamed ? "stream:128" : "dense";
    unit.shared_prefill = !h2o_streamed;
  }
  // Tokens per layer and KV head after the first turn, of 1000 seen (2 layers x 2 heads):
  // the full cache keeps all, SnapKV its budget in every head, H2O ragged heads.
  for (UnitRecord& unit : u) {
    unit.head_tokens_seen = 1000;
    const int64_t b = unit.budget.empty() ? 1000 : std::stoll(unit.budget.substr(7));
    unit.head_tokens = unit.method.rfind("h2o", 0) == 0
                           ? std::vector<std::vector<int64_t>>{{b + 64, b - 64}, {b, b}}
                           : std::vector<std::vector<int64_t>>{{b, b}, {b, b}};
  }
  return u;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// Cells of a Markdown table row: '|' not preceded by a backslash separate them.
size_t md_columns(const std::string& line) {
  size_t pipes = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\\') {
      ++i;
      continue;
    }
    if (line[i] == '|') ++pipes;
  }
  return pipes - 1;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The fixed units under `run`, in a finished run of a new db at `path`.
void write_fixed_units(const std::string& path, const RunRecord& run) {
  auto db = ResultsDb::open(path);
  const int64_t id = db->begin_run(run);
  int n = 0;
  for (UnitRecord u : fixed_units()) {
    u.key = "unit" + std::to_string(n++);
    db->write_unit(id, u);
  }
  db->finish_run(id);
}

}  // namespace

TEST_CASE("aggregate_units: exact means, by-turn, kv_vs_reference, nullopt and order", "[reports]") {
  const int64_t mib = 1024 * 1024;
  std::vector<UnitRecord> units = {
      unit("b_task", "snapkv:budget=64", "budget=64", "multi-turn",
           {turn(1, 1.0, 10, 100, 2 * mib, 3 * mib, 0.5, 1.0),
            turn(2, 0.0, 20, 0, 2 * mib, 5 * mib, std::nullopt, std::nullopt),
            turn(3, std::nullopt, 30, 50, 2 * mib, 4 * mib, 0.25, 0.5)}),
      unit("b_task", "snapkv:budget=64", "budget=64", "multi-turn",
           {turn(1, 0.5, 40, 300, 4 * mib, 4 * mib), turn(2, 0.5, 50, 0, 4 * mib, 4 * mib)}),
      unit("b_task", "full", "", "multi-turn",
           {turn(1, 1.0, 10, 10, 12 * mib, 12 * mib), turn(2, 1.0, 10, 10, 12 * mib, 12 * mib)}),
      unit("a_task", "h2o:budget=64", "budget=64", "multi-turn",
           {turn(1, std::nullopt, 5, 0, mib, mib)}),
      unit("b_task", "full", "", "multi-request", {turn(1, 0.25, 10, 10, 6 * mib, 6 * mib)}),
      unit("b_task", "snapkv:budget=32", "budget=32", "multi-turn",
           {turn(1, 0.0, 10, 10, mib, mib)}),
  };
  const std::vector<Aggregate> rows = aggregate_units(units);
  REQUIRE(rows.size() == 5);
  // task, mode, method, budget.
  CHECK(rows[0].task == "a_task");
  CHECK(rows[1].method == "full");
  CHECK(rows[1].mode == "multi-request");
  CHECK(rows[2].method == "full");
  CHECK(rows[2].mode == "multi-turn");
  CHECK(rows[3].method == "snapkv:budget=32");
  CHECK(rows[4].method == "snapkv:budget=64");

  const Aggregate& s = rows[4];
  CHECK(s.units == 2);
  CHECK(s.turns == 5);
  REQUIRE(s.accuracy);
  CHECK(*s.accuracy == Approx(0.5));  // (1 + 0 + 0.5 + 0.5) / 4
  REQUIRE(s.accuracy_by_turn.size() == 2);  // turn 3 has no score
  CHECK(s.accuracy_by_turn[0] == Approx(0.75));
  CHECK(s.accuracy_by_turn[1] == Approx(0.25));
  REQUIRE(s.first_token_kl);
  CHECK(*s.first_token_kl == Approx(0.375));
  REQUIRE(s.top1_agreement);
  CHECK(*s.top1_agreement == Approx(0.75));
  CHECK(s.ttft_ms == Approx(30.0));                // (10+20+30+40+50)/5
  CHECK(s.decode_tokens_per_s == Approx(150.0));   // (100+50+300)/3, zeros left out
  CHECK(s.kv_bytes == Approx(2.8 * mib));          // (2+2+2+4+4)/5 MiB
  CHECK(s.kv_bytes_peak == 5 * mib);
  CHECK(s.kv_read_per_step == Approx(1.4 * mib));  // half of each turn's KV
  // No bf16 run in these units: measured against the full cache.
  CHECK(s.reference == "full");
  REQUIRE(s.kv_vs_reference);
  CHECK(*s.kv_vs_reference == Approx(2.8 / 12.0));

  CHECK(*rows[2].kv_vs_reference == Approx(1.0));
  CHECK(*rows[1].kv_vs_reference == Approx(1.0));  // its own mode's full
  CHECK(*rows[3].kv_vs_reference == Approx(1.0 / 12.0));

  const Aggregate& h = rows[0];  // no score, no fidelity, no full on its task
  CHECK_FALSE(h.accuracy);
  CHECK(h.accuracy_by_turn.empty());
  CHECK_FALSE(h.first_token_kl);
  CHECK_FALSE(h.top1_agreement);
  CHECK_FALSE(h.kv_vs_reference);
  CHECK(h.decode_tokens_per_s == 0);

  CHECK(aggregate_units({}).empty());
}

TEST_CASE("aggregate_units: KV bytes against the bf16 cache by default, fp32 on request",
          "[reports]") {
  const int64_t mib = 1024 * 1024;
  const std::vector<UnitRecord> units = {
      unit("t", "full", "", "multi-turn", {turn(1, 1.0, 10, 10, 12 * mib, 12 * mib)}),
      unit("t", "bf16", "", "multi-turn", {turn(1, 1.0, 10, 10, 6 * mib, 6 * mib, 0.001, 1.0)}),
      unit("t", "kivi:bits=2", "", "multi-turn", {turn(1, 1.0, 10, 10, 3 * mib, 3 * mib)}),
      unit("u", "kivi:bits=2", "", "multi-turn", {turn(1, 1.0, 10, 10, 3 * mib, 3 * mib)}),
  };
  const auto by_method = [](const std::vector<Aggregate>& rows, const std::string& task,
                            const std::string& method) {
    for (const Aggregate& a : rows) {
      if (a.task == task && a.method == method) return a;
    }
    FAIL("no row " << method << " on " << task);
    return Aggregate{};
  };
  const std::vector<Aggregate> bf16 = aggregate_units(units);
  CHECK(by_method(bf16, "t", "kivi:bits=2").reference == "bf16");
  CHECK(*by_method(bf16, "t", "kivi:bits=2").kv_vs_reference == Approx(0.5));
  CHECK(*by_method(bf16, "t", "full").kv_vs_reference == Approx(2.0));
  CHECK(*by_method(bf16, "t", "bf16").kv_vs_reference == Approx(1.0));
  CHECK_FALSE(by_method(bf16, "u", "kivi:bits=2").kv_vs_reference);  // no bf16 run on u

  const std::vector<Aggregate> fp32 = aggregate_units(units, KvReference::Fp32);
  CHECK(by_method(fp32, "t", "kivi:bits=2").reference == "full");
  CHECK(*by_method(fp32, "t", "kivi:bits=2").kv_vs_reference == Approx(0.25));

  // The report names its reference and gives the bf16 cache's KL as the noise floor.
  const std::string md = render_leaderboard_markdown({}, bf16);
  CHECK(md.find("KV vs bf16") != std::string::npos);
  CHECK(md.find("0.0010 nats, is the noise floor") != std::string::npos);
  CHECK(render_leaderboard_markdown({}, fp32).find("KV vs full") != std::string::npos);

  CHECK_THROWS_WITH(parse_kv_reference("fp16"), Catch::Contains("--reference fp16"));
}

TEST_CASE("aggregate_units: a turn index without scores below scored ones is NaN", "[reports]") {
  const auto rows = aggregate_units({unit("t", "m", "", "multi-turn",
                                          {turn(1, std::nullopt, 1, 1, 1, 1),
                                           turn(2, 1.0, 1, 1, 1, 1)})});
  REQUIRE(rows.size() == 1);
  REQUIRE(rows[0].accuracy_by_turn.size() == 2);
  CHECK(std::isnan(rows[0].accuracy_by_turn[0]));
  CHECK(rows[0].accuracy_by_turn[1] == 1.0);
}

TEST_CASE("leaderboard Markdown matches the golden file", "[reports]") {
  const std::string md = render_leaderboard_markdown(fixed_runs(), aggregate_units(fixed_units()));
  const std::string golden_path = std::string(KVBENCH_FIXTURES) + "/leaderboard_golden.md";
  const std::string golden = read_file(golden_path);
  if (md != golden) {
    const auto a = lines_of(md), g = lines_of(golden);
    size_t i = 0;
    while (i < a.size() && i < g.size() && a[i] == g[i]) ++i;
    UNSCOPED_INFO("rendered Markdown differs from " << golden_path << " at line " << i + 1
                  << "\n  golden:   " << (i < g.size() ? g[i] : "<end of file>")
                  << "\n  rendered: " << (i < a.size() ? a[i] : "<end of output>")
                  << "\nIf the change is intended, write the new output over the golden file "
                     "(check it by eye first; KVBENCH_LEADERBOARD_MD=PATH writes it to PATH). "
                     "Whole rendered output:\n"
                  << md);
  }
  CHECK(md == golden);
  // Writes the rendered output, to compare or to become the new golden file, when asked.
  if (const char* out = std::getenv("KVBENCH_LEADERBOARD_MD")) std::ofstream(out) << md;
  // Deterministic.
  CHECK(render_leaderboard_markdown(fixed_runs(), aggregate_units(fixed_units())) == md);
}

TEST_CASE("leaderboard: spot checks of the fixed input", "[reports]") {
  const auto rows = aggregate_units(fixed_units());
  const std::string md = render_leaderboard_markdown(fixed_runs(), rows);
  // full first, then by average: snapkv 256 (retr 0.833, multihop 0.5) before h2o.
  const size_t full = md.find("| full | – | multi-turn |");
  const size_t snap256 = md.find("| snapkv:budget=256,window=32,kernel=5,pool=avg | 256 |");
  const size_t h2o128 = md.find("| h2o:budget=128,recent=0.5 | 128 |");
  REQUIRE(full != std::string::npos);
  REQUIRE(snap256 != std::string::npos);
  REQUIRE(h2o128 != std::string::npos);
  CHECK(full < snap256);
  CHECK(snap256 < h2o128);
  CHECK(md.find("a1b2c3d4e5f6") != std::string::npos);
  CHECK(md.find("a1b2c3d4e5f60") == std::string::npos);  // 12 hex digits only
  CHECK(md.find("0.25x") != std::string::npos);  // snapkv 128: 2 MiB of 8
}

TEST_CASE("leaderboard: hostile db strings are escaped", "[reports]") {
  const std::string evil = "evil|<script>alert(1)</script>";
  std::vector<UnitRecord> units = {
      unit("a_b*c", evil, "budget=64", "multi-turn",
           {turn(1, 1.0, 10, 10, 100, 100), turn(2, 0.0, 10, 10, 100, 100)}),
      unit("a_b*c", "full", "", "multi-turn",
           {turn(1, 1.0, 10, 10, 400, 400), turn(2, 1.0, 10, 10, 400, 400)}),
      unit("x|y\nz`[w](v)\\", "full", "", "multi-turn", {turn(1, 1.0, 10, 10, 400, 400)}),
  };
  units[0].head_tokens = {{1, 2}};
  units[0].head_tokens_seen = 4;
  units[0].sample_id = "<b>s</b> https://x";
  std::vector<RunRecord> runs = fixed_runs();
  runs[0].model_path = "https://evil.example/m.gguf\"><script>x</script>";
  runs[0].command_line = "kvbench run --x '<img src=http://evil.example/a.png>'";
  runs[0].host = "h&<>\"'";
  const auto rows = aggregate_units(units);

  SECTION("Markdown rows keep their column count") {
    const std::string md = render_leaderboard_markdown(runs, rows);
    CHECK(md.find("<script>") == std::string::npos);
    CHECK(md.find("a\\_b\\*c") != std::string::npos);
    size_t header_cols = 0;
    int tables = 0;
    for (const std::string& line : lines_of(md)) {
      if (line.empty() || line[0] != '|') {
        header_cols = 0;
        continue;
      }
      if (header_cols == 0) {
        header_cols = md_columns(line);
        ++tables;
      } else {
        INFO(line);
        CHECK(md_columns(line) == header_cols);
      }
    }
    CHECK(tables == 3);
    // The hostile task name stays one line: the accuracy header has 3 + 2 tasks + 1 columns.
    CHECK(md.find("| method | budget | mode | a\\_b\\*c | x\\|y z\\`\\[w\\](v)\\\\ | average |") !=
          std::string::npos);
  }

  SECTION("HTML escapes every db string and loads nothing") {
    const std::string html = render_leaderboard_html(runs, rows, first_sample_head_maps(units));
    CHECK(html.find("Kept tokens per layer and head") != std::string::npos);
    CHECK(html.find("<rect class=\"cell\"") != std::string::npos);
    CHECK(html.find("<script") == std::string::npos);
    CHECK(html.find("&lt;script&gt;") != std::string::npos);
    CHECK(html.find("<img") == std::string::npos);
    CHECK(html.find("h&amp;&lt;&gt;&quot;&#39;") != std::string::npos);
    std::string rest = html;
    const std::string ns = "xmlns=\"http://www.w3.org/2000/svg\"";
    for (size_t p = rest.find(ns); p != std::string::npos; p = rest.find(ns)) rest.erase(p, ns.size());
    CHECK(rest.find("http://") == std::string::npos);
    CHECK(rest.find("https://") == std::string::npos);
    CHECK(rest.find("://") == std::string::npos);
    CHECK(rest.find("url(") == std::string::npos);
    CHECK(rest.find("@import") == std::string::npos);
    // Every '<' left opens one of the renderer's own tags, and no tag loads anything.
    const std::set<std::string> allowed = {
        "!DOCTYPE", "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "b", "br",
        "table", "tr", "th", "td", "wbr", "svg", "g", "line", "polyline", "circle", "rect", "text",
        "div"};
    for (size_t p = rest.find('<'); p != std::string::npos; p = rest.find('<', p + 1)) {
      const size_t end = rest.find('>', p);
      REQUIRE(end != std::string::npos);
      const std::string tag = rest.substr(p + 1, end - p - 1);
      const std::string name = tag.substr(tag[0] == '/', tag.find_first_of(" />", 1) - (tag[0] == '/'));
      INFO(tag);
      CHECK(allowed.count(name) == 1);
      CHECK(tag.find("src=") == std::string::npos);
      CHECK(tag.find("href=") == std::string::npos);
      CHECK(tag.find(" on") == std::string::npos);  // no event handlers
    }
  }
}

TEST_CASE("write_reports: a script payload in every text column of a db survives nowhere",
          "[reports]") {
  // Leaderboards are shared files: the viewer is the victim. Every TEXT column of every table
  // (but head_tokens, which must stay a JSON array) holds a payload, distinct per row so that
  // units, tasks, methods and modes stay apart and every table and chart has rows.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() /
                       ("kvbench_payload_" + std::to_string(static_cast<long>(::getpid())));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string db_path = (dir / "payload.sqlite").string();
  write_fixed_units(db_path, fixed_runs()[0]);
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(db_path.c_str(), &db) == SQLITE_OK);
  const std::string payload = "'<script>alert(1)</script><img src=x onerror=alert(1)>' || ";
  int columns = 0;
  for (const char* table : {"runs", "units", "results"}) {
    sqlite3_stmt* info = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, (std::string("PRAGMA table_info(") + table + ")").c_str(), -1,
                               &info, nullptr) == SQLITE_OK);
    std::vector<std::string> text_columns;
    while (sqlite3_step(info) == SQLITE_ROW) {
      const std::string name = reinterpret_cast<const char*>(sqlite3_column_text(info, 1));
      const std::string type = reinterpret_cast<const char*>(sqlite3_column_text(info, 2));
      if (type == "TEXT" && name != "head_tokens") text_columns.push_back(name);
    }
    sqlite3_finalize(info);
    for (const std::string& column : text_columns) {
      // Units pair up as one method in two modes, multi-turn and a payload, so that the
      // modes table (whose header once took the mode raw) has rows.
      const std::string value =
          column == "method" || column == "method_family" || column == "method_series"
              ? payload + "((id + 1) / 2)"
          : column == "mode" ? "CASE id % 2 WHEN 0 THEN 'multi-turn' ELSE " + payload + "id END"
                             : payload + "id";
      const std::string update = std::string("UPDATE ") + table + " SET " + column + " = " + value;
      INFO(update);
      REQUIRE(sqlite3_exec(db, update.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
      ++columns;
    }
  }
  sqlite3_close(db);
  CHECK(columns == 31);  // 9 in runs, 11 in units, 11 in results
  write_reports(db_path, (dir / "out").string());
  const std::string html = read_file((dir / "out" / "leaderboard.html").string());
  CHECK(html.find("Multi-turn vs multi-request") != std::string::npos);  // the modes table
  CHECK(html.find("&lt;script&gt;") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("onerror=") == std::string::npos);
  CHECK(html.find("<img") == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("leaderboard HTML is balanced and has its charts", "[reports]") {
  const std::string html = render_leaderboard_html(fixed_runs(), aggregate_units(fixed_units()),
                                                   first_sample_head_maps(fixed_units()));
  CHECK(html.rfind("<!DOCTYPE html>", 0) == 0);
  // accuracy vs budget, TTFT, memory, by turn, and a kept-token map for each of multihop_vt's
  // 5 multi-turn methods
  CHECK(count(html, "<svg") == 4 + 5);
  CHECK(count(html, "<rect class=\"cell\"") == 5 * 4);
  CHECK(count(html, "<div") == count(html, "</div>"));
  CHECK(count(html, "<svg") == count(html, "</svg>"));
  CHECK(count(html, "<table") == count(html, "</table>"));
  CHECK(count(html, "<table") == 6);  // runs, accuracy, cost, by turn, modes and modes by turn
  CHECK(count(html, "<tr") == count(html, "</tr>"));
  CHECK(count(html, "<text") == count(html, "</text>"));
  CHECK(count(html, "<g>") == count(html, "</g>"));
  CHECK(count(html, "<title>") == count(html, "</title>"));
  CHECK(count(html, "<td") == count(html, "</td>"));
  CHECK(count(html, "<th") - count(html, "<thead") == count(html, "</th>"));
  CHECK(html.find("</html>") != std::string::npos);
  CHECK(count(html, "class=\"ref\"") >= 2);  // the full cache's dashed line and its legend
  CHECK(html.find("<polyline") != std::string::npos);
  CHECK(html.find("turn 3") != std::string::npos);
  CHECK(html.find("nan") == std::string::npos);
  CHECK(html.find("inf") == std::string::npos);

  // Writes a copy to look at (e.g. with a headless browser) when asked.
  if (const char* out = std::getenv("KVBENCH_LEADERBOARD_HTML")) {
    std::ofstream(out) << html;
  }
}

TEST_CASE("leaderboard: an empty aggregate renders without rows", "[reports]") {
  const std::string md = render_leaderboard_markdown({}, {});
  CHECK(md.find("- Runs: 0") != std::string::npos);
  CHECK(md.find("No multi-turn rows") != std::string::npos);
  const std::string html = render_leaderboard_html({}, {});
  CHECK(count(html, "<svg") == count(html, "</svg>"));
}

TEST_CASE("leaderboard: time per unit, means of the timed units, none without", "[reports]") {
  // Two samples of full (the first of each carries the shared forward) and one of snapkv
  // (the reference ran before it); an older unit without a wall time is left out.
  std::vector<UnitRecord> units;
  const auto timed = [&](const std::string& method, const std::string& sample, double wall,
                         double shared, double reference) {
    UnitRecord u = unit("niah", method, method == "full" ? "" : "ratio=0.5", "multi-turn",
                        {turn(1, 1.0, 10, 20, 100, 100)});
    u.sample_id = sample;
    u.key += "|" + sample;
    u.wall_ms = wall;
    u.shared_forward_ms = shared;
    u.reference_ms = reference;
    units.push_back(u);
  };
  timed("full", "a", 10000, 6000, 0);
  timed("full", "b", 20000, 8000, 0);
  timed("snapkv", "a", 9000, 0, 4000);
  timed("snapkv", "old", 0, 0, 0);
  const std::string md = render_leaderboard_markdown({}, aggregate_units(units));
  INFO(md);
  CHECK(md.find("## Time per unit") != std::string::npos);
  CHECK(md.find("| full | – | multi-turn | 2 | 15.0 | 7.0 | 0.0 | 8.0 |") != std::string::npos);
  CHECK(md.find("| snapkv | ratio=0.5 | multi-turn | 1 | 9.0 | 0.0 | 4.0 | 5.0 |") != std::string::npos);
  const std::string html = render_leaderboard_html({}, aggregate_units(units));
  CHECK(html.find("<h2>Time per unit</h2>") != std::string::npos);
  for (UnitRecord& u : units) u.wall_ms = 0;  // a db written before schema v8
  CHECK(render_leaderboard_markdown({}, aggregate_units(units)).find("Time per unit") ==
        std::string::npos);
}

TEST_CASE("write_reports: a results db to leaderboard.md and leaderboard.html", "[reports]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() /
                       ("kvbench_reports_" + std::to_string(static_cast<long>(::getpid())));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string db_path = (dir / "results.sqlite").string();
  const std::string empty_path = (dir / "empty.sqlite").string();
  write_fixed_units(db_path, fixed_runs()[0]);
  ResultsDb::open(empty_path)->begin_run(fixed_runs()[0]);
  const fs::path out = dir / "out" / "nested";
  write_reports(db_path, out.string());
  const std::string md = read_file((out / "leaderboard.md").string());
  const std::string html = read_file((out / "leaderboard.html").string());
  {
    auto db = ResultsDb::open(db_path, true);
    const auto rows = aggregate_units(db->units());
    CHECK(md == render_leaderboard_markdown(db->runs(), rows));
    CHECK(html == render_leaderboard_html(db->runs(), rows, first_sample_head_maps(db->units())));
    CHECK(html.find("Kept tokens per layer and head") != std::string::npos);
    CHECK(html.find("task multihop_vt, sample s, multi-turn") != std::string::npos);
    CHECK(html.find("layer 0, KV head 0: 192 of 1000 tokens (19.2%)") != std::string::npos);
  }
  CHECK(md.find("| full | – | multi-turn | 83.3 [50.0, 100.0] | 100.0 [43.9, 100.0] | 91.7 [75.0, 100.0] |") !=
        std::string::npos);
  for (const auto& entry : fs::directory_iterator(out)) {  // no temporary left beside them
    CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
  }
  // Written again over the old files.
  write_reports(db_path, out.string());
  CHECK(read_file((out / "leaderboard.md").string()) == md);

  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "no InputError";
  };
  CHECK(message([&] { write_reports(empty_path, (dir / "out2").string()); })
            .rfind("DB: no results to report", 0) == 0);
  CHECK_FALSE(fs::exists(dir / "out2"));
  std::ofstream(dir / "a_file") << "x";
  CHECK(message([&] { write_reports(db_path, (dir / "a_file" / "sub").string()); })
            .rfind("OUT_DIR: cannot create the report directory", 0) == 0);
  CHECK(message([&] { write_reports((dir / "missing.sqlite").string(), (dir / "out3").string()); }) !=
        "no InputError");
  fs::remove_all(dir);
}

TEST_CASE("leaderboard: left-out tasks, intervals and the memory axis", "[reports]") {
  std::vector<RunRecord> runs = fixed_runs();
  runs[0].config_json =
      R"({"tasks": [], "excluded_tasks": [{"task": "math_find", "reason": "full cache 40% (95% )"
      R"(interval 23%-59%, 25 turns) at 1024 tokens in calibration, below 80%"},)"
      R"( {"task": "<b>x</b>", "reason": "not calibrated"}],)"
      R"( "calibrated_tasks": [{"task": "retr_kv", "accuracy": 0.96, "no_context_accuracy": 0.04},)"
      R"( {"task": "<img src=x>", "accuracy": 1, "no_context_accuracy": 0}]})";
  const auto rows = aggregate_units(fixed_units());
  const std::string md = render_leaderboard_markdown(runs, rows);
  CHECK(md.find("**Left out**") != std::string::npos);
  // The no-context control beside the full cache's accuracy, for the tasks that ran.
  CHECK(md.find("- retr\\_kv: 96% with the context, 4% without it") != std::string::npos);
  CHECK(render_leaderboard_html(runs, rows).find("<li>&lt;img src&#61;x&gt;: 100% with the context") !=
        std::string::npos);
  CHECK(md.find("- math\\_find: full cache 40% (95% interval 23%-59%, 25 turns) at 1024 tokens "
                "in calibration, below 80%") != std::string::npos);
  const std::string html = render_leaderboard_html(runs, rows);
  CHECK(html.find("<b>Left out</b>") != std::string::npos);
  CHECK(html.find("<li>&lt;b&gt;x&lt;/b&gt;: not calibrated</li>") != std::string::npos);
  // Accuracy cells carry their intervals, the chart error bars, its x axis the memory
  // relative to full.
  CHECK(html.find(" ±") != std::string::npos);
  CHECK(html.find("class=\"err\"") != std::string::npos);
  CHECK(html.find("KV bytes relative to the full cache") != std::string::npos);
  // Its ticks read as the Cost table's ratios (snapkv at 128 and 256 of 512 tokens).
  CHECK(html.find(">1/4x</text>") != std::string::npos);
  CHECK(html.find(">1/2x</text>") != std::string::npos);
  CHECK(html.find(">1x</text>") != std::string::npos);
  CHECK(html.find("KV budget") == std::string::npos);
  // Without excluded tasks there is no such section.
  CHECK(render_leaderboard_markdown(fixed_runs(), rows).find("Left out") == std::string::npos);
}

TEST_CASE("write_reports: a run config's excluded_tasks become the Left out section",
          "[reports]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() /
                       ("kvbench_left_out_" + std::to_string(static_cast<long>(::getpid())));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string db_path = (dir / "results.sqlite").string();
  RunRecord run = fixed_runs()[0];
  run.config_json =
      R"({"tasks": ["multihop_vt", "retr_kv"], "excluded_tasks": [{"task": "math_find", )"
      R"("reason": "full cache 12.0% (n=25) in calibration, below 80%"}]})";
  write_fixed_units(db_path, run);
  write_reports(db_path, (dir / "out").string());
  const std::string md = read_file((dir / "out" / "leaderboard.md").string());
  const std::string html = read_file((dir / "out" / "leaderboard.html").string());
  CHECK(md.find("- math\\_find: full cache 12.0% (n=25) in calibration, below 80%\n") !=
        std::string::npos);
  CHECK(html.find("<li>math_find: full cache 12.0% (n&#61;25) in calibration, below 80%</li>") !=
        std::string::npos);
  // The section sits under the accuracy table, before the cost table.
  CHECK(md.find("**Left out**") > md.find("## Accuracy (%)"));
  CHECK(md.find("**Left out**") < md.find("## Cost and fidelity"));
  fs::remove_all(dir);
}

namespace {

struct Cell {
  int layer = -1, head = -1;
  std::string fill;
};

// The heat map's cells in document order.
std::vector<Cell> cells_of(const std::string& svg) {
  std::vector<Cell> out;
  const std::string open = "<rect class=\"cell\"";
  auto attr = [](const std::string& tag, const std::string& name) {
    const size_t p = tag.find(" " + name + "=\"");
    if (p == std::string::npos) return std::string();
    const size_t from = p + name.size() + 3;
    return tag.substr(from, tag.find('"', from) - from);
  };
  for (size_t p = svg.find(open); p != std::string::npos; p = svg.find(open, p + 1)) {
    const std::string tag = svg.substr(p, svg.find('>', p) - p);
    out.push_back({std::stoi(attr(tag, "data-layer")), std::stoi(attr(tag, "data-head")),
                   attr(tag, "fill")});
  }
  return out;
}

// Relative luminance of "#rrggbb" (sRGB weights, no gamma: enough to order fills).
double luminance(const std::string& fill) {
  REQUIRE(fill.size() == 7);
  const auto channel = [&](int i) { return std::stoi(fill.substr(1 + 2 * i, 2), nullptr, 16); };
  return 0.2126 * channel(0) + 0.7152 * channel(1) + 0.0722 * channel(2);
}

}  // namespace

TEST_CASE("mode comparison: each method beside itself in every mode, with intervals by turn",
          "[reports]") {
  // snapkv holds in multi-request use and falls over a session's turns; query-aware
  // multi-turn keeps its first turn. Two samples each; the full cache everywhere.
  const auto turns = [](std::vector<double> scores) {
    std::vector<TurnRow> out;
    for (size_t i = 0; i < scores.size(); ++i) {
      out.push_back(turn(static_cast<int32_t>(i + 1), scores[i], 10, 5, 100, 100));
    }
    return out;
  };
  std::vector<UnitRecord> units;
  const auto add = [&](const std::string& method, const std::string& budget,
                       const std::string& mode, const std::string& query,
                       const std::vector<double>& scores) {
    for (const char* sample : {"a", "b"}) {
      UnitRecord u = unit("retr_kv", method, budget, mode, turns(scores));
      u.sample_id = sample;
      u.query_setting = query;
      u.key += std::string("|") + sample + "|" + query;
      units.push_back(u);
    }
  };
  add("full", "", "multi-turn", "agnostic", {1, 1, 1});
  add("full", "", "multi-request", "agnostic", {1, 1, 1});
  add("snapkv:budget=8", "budget=8", "multi-turn", "agnostic", {1, 0, 0});
  add("snapkv:budget=8", "budget=8", "multi-turn", "aware", {1, 1, 0});
  add("snapkv:budget=8", "budget=8", "multi-request", "agnostic", {1, 1, 1});
  const std::vector<Aggregate> aggs = aggregate_units(units);
  const ModeComparison c = compare_modes(aggs);
  REQUIRE(c.modes == std::vector<std::string>{"multi-turn", "multi-turn query-aware",
                                              "multi-request"});
  REQUIRE(c.rows.size() == 2);
  CHECK(c.rows[0].method == "full");
  CHECK_FALSE(c.rows[0].cells[1].accuracy.has_value());  // full never ran query-aware
  const ModeComparisonRow& snap = c.rows[1];
  REQUIRE(snap.cells[0].accuracy.has_value());
  CHECK(snap.cells[0].accuracy->mean == Approx(2.0 / 6));
  CHECK(snap.cells[0].accuracy->n == 6);
  CHECK(snap.cells[1].accuracy->mean == Approx(4.0 / 6));
  CHECK(snap.cells[2].accuracy->mean == Approx(1.0));
  REQUIRE(snap.cells[0].by_turn.size() == 3);
  CHECK(snap.cells[0].by_turn[0].mean == 1.0);
  CHECK(snap.cells[0].by_turn[1].mean == 0.0);
  CHECK(snap.cells[0].by_turn[1].n == 2);  // two samples at turn 2
  CHECK(snap.cells[0].by_turn[1].high > 0.0);  // Wilson's interval is not a point
  // The leaderboard shows it, and the aware rows stay apart in every table.
  const std::string md = render_leaderboard_markdown(fixed_runs(), aggs);
  CHECK(md.find("## Multi-turn vs multi-request") != std::string::npos);
  CHECK(md.find("| snapkv:budget=8 | 8 | multi-turn query-aware |") != std::string::npos);
  const std::string html = render_leaderboard_html(fixed_runs(), aggs, {});
  CHECK(html.find("id=\"modes\"") != std::string::npos);
  // One mode alone: nothing to compare, no section.
  std::vector<UnitRecord> turn_only(units.begin(), units.begin() + 2);
  CHECK(compare_modes(aggregate_units(turn_only)).modes.empty());
  CHECK(render_leaderboard_markdown(fixed_runs(), aggregate_units(turn_only))
            .find("Multi-turn vs multi-request") == std::string::npos);
}

TEST_CASE("head map: 2 layers x 2 heads render row-major cells, darker where more is kept",
          "[reports]") {
  HeadMap map;
  map.method = "adakv+snapkv:ratio=0.5";
  map.task = "retr_kv";
  map.sample_id = "retr_kv-0";
  map.mode = "multi-turn";
  map.tokens_seen = 200;
  map.kept = {{200, 50}, {100, 0}};  // fractions 1, 0.25 / 0.5, 0
  const std::string svg = head_map_svg(map);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(count(svg, "<svg") == count(svg, "</svg>"));
  CHECK(count(svg, "<text") == count(svg, "</text>"));
  CHECK(count(svg, "<title>") == count(svg, "</title>"));
  CHECK(svg.find("adakv+snapkv:ratio&#61;0.5 \xC2\xB7 retr_kv \xC2\xB7 sample retr_kv-0") !=
        std::string::npos);  // the title line

  const std::vector<Cell> cells = cells_of(svg);
  REQUIRE(cells.size() == 4);
  const std::vector<std::pair<int, int>> order = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  for (size_t i = 0; i < 4; ++i) {
    CHECK(cells[i].layer == order[i].first);
    CHECK(cells[i].head == order[i].second);
  }
  CHECK(cells[0].fill == kept_fraction_colour(1.0));
  CHECK(cells[1].fill == kept_fraction_colour(0.25));
  CHECK(cells[2].fill == kept_fraction_colour(0.5));
  CHECK(cells[3].fill == kept_fraction_colour(0.0));
  // More kept, darker: layer 0 head 0 (all) < layer 1 head 0 (half) < layer 0 head 1 (a
  // quarter) < layer 1 head 1 (none).
  CHECK(luminance(cells[0].fill) < luminance(cells[2].fill));
  CHECK(luminance(cells[2].fill) < luminance(cells[1].fill));
  CHECK(luminance(cells[1].fill) < luminance(cells[3].fill));
  CHECK(svg.find("layer 0, KV head 1: 50 of 200 tokens (25.0%)") != std::string::npos);
  CHECK(svg.find("layer 1, KV head 1: 0 of 200 tokens (0.0%)") != std::string::npos);
  CHECK(svg.find("kept 43.8% on average") != std::string::npos);  // 350 / (4 * 200)
  // The legend: ten steps, lightest at the bottom, and its labels.
  CHECK(count(svg, "class=\"scale\"") == 10);
  CHECK(svg.find(">kept/seen</text>") != std::string::npos);
  CHECK(svg.find(">0.5</text>") != std::string::npos);

  // The scale is monotone and clamped.
  for (int i = 0; i < 20; ++i) {
    INFO(i);
    CHECK(luminance(kept_fraction_colour((i + 1) / 20.0)) < luminance(kept_fraction_colour(i / 20.0)));
  }
  CHECK(kept_fraction_colour(-1) == kept_fraction_colour(0));
  CHECK(kept_fraction_colour(2) == kept_fraction_colour(1));
  CHECK(kept_fraction_colour(std::nan("")) == kept_fraction_colour(0));
}

TEST_CASE("head map: one sample of the first task, full first, units without maps skipped",
          "[reports]") {
  auto with_map = [](const std::string& task, const std::string& sample, const std::string& method,
                     const std::string& mode, int64_t kept) {
    UnitRecord u;
    u.task = task;
    u.sample_id = sample;
    u.method = method;
    u.parts = stored_method_parts(method);
    u.mode = mode;
    u.head_tokens = {{kept, kept}};
    u.head_tokens_seen = 10;
    return u;
  };
  std::vector<UnitRecord> units = {
      with_map("retr_kv", "r-0", "snapkv:ratio=0.5", "multi-turn", 5),
      with_map("multihop_vt", "m-1", "snapkv:ratio=0.5", "multi-turn", 5),
      with_map("multihop_vt", "m-0", "snapkv:ratio=0.5", "multi-turn", 5),
      with_map("multihop_vt", "m-1", "adakv+snapkv:ratio=0.5", "multi-turn", 5),
      with_map("multihop_vt", "m-1", "full", "multi-turn", 10),
      with_map("multihop_vt", "m-1", "h2o:ratio=0.5", "multi-request", 5),
  };
  UnitRecord old = with_map("aaa_task", "a-0", "full", "multi-turn", 1);
  old.head_tokens.clear();  // written before schema v5
  units.insert(units.begin(), old);
  const std::vector<HeadMap> maps = first_sample_head_maps(units);
  REQUIRE(maps.size() == 3);
  CHECK(maps[0].method == "full");
  CHECK(maps[1].method == "adakv+snapkv:ratio=0.5");
  CHECK(maps[2].method == "snapkv:ratio=0.5");
  for (const HeadMap& m : maps) {
    CHECK(m.task == "multihop_vt");
    CHECK(m.sample_id == "m-1");  // the first of its samples written
    CHECK(m.mode == "multi-turn");
    CHECK(m.tokens_seen == 10);
  }
  CHECK(first_sample_head_maps({old}).empty());
  const std::string html = render_leaderboard_html({}, {}, {});
  CHECK(html.find("No unit recorded its tokens per KV head") != std::string::npos);
}
