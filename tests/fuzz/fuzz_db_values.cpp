// Valid results dbs with hostile values (issue 39): a small db written through the results
// API, then edited as someone with sqlite3 could (any value of any type in any column of any
// row), then read by report, check and merge. Every value read from a db is checked once, on
// read (store/results_db.cpp, CheckedRow): what is not in range is an InputError naming the
// db, table, column and row; what is in range renders, and its baseline parses back.
//
// The input is a list of edits, each: table, column, row, kind of value, then the value's
// bytes (an integer, a double's bits, or text of a given length).
#include <sqlite3.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "reports/aggregate.h"
#include "reports/leaderboard.h"
#include "reports/regression_check.h"
#include "store/results_db.h"

using namespace kvbench;

namespace {

const std::string& work_dir() {
  static const std::string dir = [] {
    const std::string d = std::filesystem::temp_directory_path().string() + "/kvbench_fuzz_db_" +
                          std::to_string(static_cast<long>(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// The valid db every input starts from: two runs' worth of units in two modes, scored and
// unscored turns, a head map.
const std::vector<char>& template_db() {
  static const std::vector<char> bytes = [] {
    const std::string path = work_dir() + "/template.db";
    std::filesystem::remove(path);
    {
      auto db = ResultsDb::open(path);
      RunRecord run;
      run.kvbench_version = "fuzz";
      run.model_path = "m.gguf";
      run.model_sha256 = "abc";
      run.config_json = "{}";
      const int64_t id = db->begin_run(run);
      int n = 0;
      for (const char* method : {"full", "snapkv:budget=64"}) {
        for (const char* mode : {"multi-turn", "multi-request"}) {
          UnitRecord u;
          u.key = "unit" + std::to_string(n++);
          u.task = "retr_kv";
          u.sample_id = "s" + std::to_string(n % 2);
          u.method = method;
          u.budget = std::string(method) == "full" ? "" : "budget=64";
          u.mode = mode;
          u.context_tokens = 512;
          u.head_tokens = {{10, 20}, {30, 40}};
          u.head_tokens_seen = 50;
          for (int t = 1; t <= 2; ++t) {
            TurnRow row;
            row.turn = t;
            row.prediction = "p";
            row.reference = "r";
            row.score = 0.5 * t;
            row.kv_bytes = 1000 * t;
            row.kv_bytes_peak = 2000;
            row.ttft_ms = 10;
            row.decode_tokens_per_s = 20;
            row.first_token_kl = 0.01;
            row.top1_agreement = 1.0;
            u.turns.push_back(row);
          }
          db->write_unit(id, u);
        }
      }
      db->finish_run(id);
    }
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  }();
  return bytes;
}

struct Table {
  const char* name;
  std::vector<std::string> columns;
};

std::vector<Table> tables(sqlite3* db) {
  std::vector<Table> out = {{"runs", {}}, {"units", {}}, {"results", {}}};
  for (Table& t : out) {
    sqlite3_stmt* s = nullptr;
    sqlite3_prepare_v2(db, (std::string("PRAGMA table_info(") + t.name + ")").c_str(), -1, &s,
                       nullptr);
    while (sqlite3_step(s) == SQLITE_ROW) {
      t.columns.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(s, 1)));
    }
    sqlite3_finalize(s);
  }
  return out;
}

// Applies the input's edits; an edit SQLite refuses (a NOT NULL, UNIQUE or foreign key
// constraint) is skipped, as sqlite3 would refuse it.
void apply_edits(const std::string& path, const uint8_t* data, size_t size) {
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  const std::vector<Table> all = tables(db);
  size_t i = 0;
  const auto next = [&]() -> uint8_t { return i < size ? data[i++] : 0; };
  while (i + 4 <= size) {
    const Table& t = all[next() % all.size()];
    const std::string& column = t.columns[next() % t.columns.size()];
    const int row = next() % 10;  // rowids 1..8 exist (0 and 9 edit nothing)
    const int kind = next() % 6;
    sqlite3_stmt* s = nullptr;
    const std::string sql = std::string("UPDATE ") + t.name + " SET " + column +
                            " = ?1 WHERE rowid = " + std::to_string(row);
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) continue;
    uint64_t bits = 0;
    if (kind <= 1) {
      for (int b = 0; b < 8; ++b) bits = bits << 8 | next();
    }
    if (kind == 0) {
      sqlite3_bind_int64(s, 1, static_cast<int64_t>(bits));
    } else if (kind == 1) {
      double x;
      std::memcpy(&x, &bits, sizeof x);
      sqlite3_bind_double(s, 1, x);
    } else if (kind == 2 || kind == 3) {  // text or blob of the next n bytes
      const size_t n = std::min<size_t>(next(), size - i);
      if (kind == 2) {
        sqlite3_bind_text(s, 1, reinterpret_cast<const char*>(data + i), static_cast<int>(n),
                          SQLITE_TRANSIENT);
      } else {
        sqlite3_bind_blob(s, 1, data + i, static_cast<int>(n), SQLITE_TRANSIENT);
      }
      i += n;
    } else if (kind == 4) {
      sqlite3_bind_null(s, 1);
    } else {  // a small integer: the ranges' edges (turns, flags, counts)
      sqlite3_bind_int64(s, 1, static_cast<int8_t>(next()));
    }
    sqlite3_step(s);
    sqlite3_finalize(s);
  }
  sqlite3_close(db);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string db_path = work_dir() + "/input.db";
  const std::string out = work_dir() + "/out";
  const std::string merged = work_dir() + "/merged.db";
  for (const std::string& p : {db_path, db_path + "-wal", db_path + "-shm", merged}) {
    std::filesystem::remove(p);
  }
  {
    const std::vector<char>& bytes = template_db();
    std::ofstream(db_path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  apply_edits(db_path, data, size);

  try {  // report
    write_reports(db_path, out);
  } catch (const InputError& e) {
    fuzz::check_input_error(e);
  }
  try {  // check: the baseline written parses back, and the db passes against it
    const std::vector<Aggregate> rows = aggregate_units(ResultsDb::open(db_path, true)->units());
    for (const Aggregate& a : rows) {
      FUZZ_CHECK(!a.accuracy || (*a.accuracy >= 0 && *a.accuracy <= 1));
      FUZZ_CHECK(std::isfinite(a.kv_bytes) && std::isfinite(a.ttft_ms));
    }
    const std::vector<Aggregate> back = parse_baseline(baseline_json(rows), "written.json");
    FUZZ_CHECK(back.size() == rows.size());
    const auto regressions = find_regressions(rows, back, Tolerances{});
    if (!regressions.empty()) std::fprintf(stderr, "%s", render_regressions(regressions, back.size()).c_str());
    FUZZ_CHECK(regressions.empty());
  } catch (const InputError& e) {
    fuzz::check_input_error(e);
  }
  try {  // merge: what it writes reads back
    merge_results({db_path}, merged);
    FUZZ_CHECK(ResultsDb::open(merged, true)->units().size() ==
               ResultsDb::open(db_path, true)->units().size());
  } catch (const InputError& e) {
    fuzz::check_input_error(e);
  }
  return 0;
}
