// The SQLite results store: schema, round trips, transactions, errors, merge.
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "common/input_error.h"
#include "reports/leaderboard.h"
#include "store/results_db.h"
#include "tests/gguf_writer.h"

namespace kvbench {
namespace {

// A file's bytes (a db that must be left as it was).
std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

using testing::temp_path;
using testing::write_file;

RunRecord make_run(const std::string& config = R"({"methods":["full"]})",
                   const std::string& model_sha = std::string(64, 'a')) {
  RunRecord r;
  r.kvbench_version = "0.1.0";
  r.git_sha = "deadbeef";
  r.model_path = "/models/tiny.gguf";
  r.model_sha256 = model_sha;
  r.host = "node-7";
  r.command_line = "kvbench sweep --config 'a b.json'";
  r.config_json = config;
  return r;
}

TurnRow make_turn(int32_t turn, double salt) {
  TurnRow t;
  t.turn = turn;
  t.query = "What is key " + std::to_string(turn) + "?";
  t.prediction = "value-" + std::to_string(turn);
  t.reference = "value-" + std::to_string(turn);
  t.stop_reason = "eos";
  t.prompt_tokens = 100 + turn;
  t.output_tokens = 7;
  t.appended_tokens = 20;
  t.ttft_ms = 12.5 + salt;
  t.tpot_ms = 3.25 + salt;
  t.prefill_tokens_per_s = 1000.0 / 3.0;
  t.decode_tokens_per_s = 0.1 + salt;
  t.kv_bytes = 1 << 20;
  t.kv_bytes_peak = 1 << 21;
  t.tokens_kept = 0.25;
  t.tokens_seen = 512;
  t.tokens_evicted = 384;
  t.hits = 3;
  t.misses = 1;
  t.bytes_moved = 4096;
  t.tokens_reused = 256;
  t.reuse_bytes_loaded = 11796736;
  t.reuse_load_ms = 4.5 + salt;
  t.reuse_tiers = "device:1/0/0/11520/0;redis:0/1/11520/0/1";
  t.reuse_faults = "redis: connection refused";
  t.first_token_kl = 0.01 * turn;
  t.top1_agreement = 1.0;
  t.score = turn % 2 == 0 ? 1.0 : 0.0;
  t.attn_flops = 1.5e9 + salt;
  t.attn_flops_dense = 3.0e9;
  if (turn == 1) t.retrieval_recall = 0.875;  // null in later turns
  return t;
}

UnitRecord make_unit(const std::string& key, const std::string& method = "snapkv",
                     int turns = 2) {
  UnitRecord u;
  u.key = key;
  u.task = "retr_kv";
  u.sample_id = "retr_kv-" + key;  // units of one db differ by more than their keys
  u.method = method;
  u.budget = "budget=256";
  u.mode = "multi-turn";
  u.seed = 7;
  u.context_tokens = 512;
  u.context_prefill_ms = 45.5;
  u.head_tokens = {{300, 212}, {256, 256}, {40, 472}};  // 3 layers x 2 KV heads, ragged
  u.head_tokens_seen = 600;
  u.query_setting = "aware";
  u.turn_gap_s = 45.5;
  u.wall_ms = 9876.25;
  u.shared_forward_ms = 5000.5;
  u.reference_ms = 1234.125;
  for (int i = 1; i <= turns; ++i) u.turns.push_back(make_turn(i, 0.5 * i));
  return u;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

bool same_opt(const std::optional<double>& a, const std::optional<double>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || same_bits(*a, *b);
}

void require_same_turn(const TurnRow& a, const TurnRow& b) {
  CHECK(a.turn == b.turn);
  CHECK(a.query == b.query);
  CHECK(a.prediction == b.prediction);
  CHECK(a.reference == b.reference);
  CHECK(a.stop_reason == b.stop_reason);
  CHECK(a.prompt_tokens == b.prompt_tokens);
  CHECK(a.output_tokens == b.output_tokens);
  CHECK(a.appended_tokens == b.appended_tokens);
  CHECK(same_bits(a.ttft_ms, b.ttft_ms));
  CHECK(same_bits(a.tpot_ms, b.tpot_ms));
  CHECK(same_bits(a.prefill_tokens_per_s, b.prefill_tokens_per_s));
  CHECK(same_bits(a.decode_tokens_per_s, b.decode_tokens_per_s));
  CHECK(a.kv_bytes == b.kv_bytes);
  CHECK(a.kv_bytes_peak == b.kv_bytes_peak);
  CHECK(same_bits(a.tokens_kept, b.tokens_kept));
  CHECK(a.tokens_seen == b.tokens_seen);
  CHECK(a.tokens_evicted == b.tokens_evicted);
  CHECK(a.hits == b.hits);
  CHECK(a.misses == b.misses);
  CHECK(a.bytes_moved == b.bytes_moved);
  CHECK(a.tokens_reused == b.tokens_reused);
  CHECK(a.reuse_bytes_loaded == b.reuse_bytes_loaded);
  CHECK(a.reuse_load_ms == b.reuse_load_ms);
  CHECK(a.reuse_tiers == b.reuse_tiers);
  CHECK(a.reuse_faults == b.reuse_faults);
  CHECK(same_opt(a.first_token_kl, b.first_token_kl));
  CHECK(same_opt(a.top1_agreement, b.top1_agreement));
  CHECK(same_opt(a.score, b.score));
  CHECK(same_bits(a.attn_flops, b.attn_flops));
  CHECK(same_bits(a.attn_flops_dense, b.attn_flops_dense));
  CHECK(same_opt(a.retrieval_recall, b.retrieval_recall));
}

void require_same_unit(const UnitRecord& a, const UnitRecord& b) {
  CHECK(a.key == b.key);
  CHECK(a.task == b.task);
  CHECK(a.sample_id == b.sample_id);
  CHECK(a.method == b.method);
  CHECK(a.budget == b.budget);
  CHECK(a.mode == b.mode);
  CHECK(a.seed == b.seed);
  CHECK(a.context_tokens == b.context_tokens);
  CHECK(same_bits(a.context_prefill_ms, b.context_prefill_ms));
  CHECK(a.head_tokens == b.head_tokens);
  CHECK(a.head_tokens_seen == b.head_tokens_seen);
  CHECK(a.query_setting == b.query_setting);
  CHECK(same_bits(a.turn_gap_s, b.turn_gap_s));
  CHECK(same_bits(a.wall_ms, b.wall_ms));
  CHECK(same_bits(a.shared_forward_ms, b.shared_forward_ms));
  CHECK(same_bits(a.reference_ms, b.reference_ms));
  REQUIRE(a.turns.size() == b.turns.size());
  for (size_t i = 0; i < a.turns.size(); ++i) require_same_turn(a.turns[i], b.turns[i]);
}

// A raw SQLite connection for looking behind the class's back.
struct Raw {
  sqlite3* db = nullptr;
  explicit Raw(const std::string& path) {
    REQUIRE(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                            nullptr) == SQLITE_OK);
  }
  ~Raw() { sqlite3_close_v2(db); }
  void exec(const std::string& sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
    INFO(sql << ": " << (err != nullptr ? err : ""));
    sqlite3_free(err);
    REQUIRE(rc == SQLITE_OK);
  }
  std::string text(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK);
    std::string out;
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0) != nullptr) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(s, 0));
    }
    sqlite3_finalize(s);
    return out;
  }
  int64_t integer(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK);
    int64_t out = -1;
    if (sqlite3_step(s) == SQLITE_ROW) out = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return out;
  }
};

bool exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

// Opening `path` throws an InputError of one line that starts with the path and contains
// `fragment`.
void require_open_error(const std::string& path, bool read_only, const std::string& fragment) {
  try {
    ResultsDb::open(path, read_only);
    FAIL("no error opening " << path);
  } catch (const InputError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.rfind(path + ": ", 0) == 0);
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(msg.find(fragment) != std::string::npos);
  }
}

// merge_results throws an InputError of one line containing every fragment.
void require_merge_error(const std::vector<std::string>& inputs, const std::string& output,
                         const std::vector<std::string>& fragments) {
  try {
    merge_results(inputs, output);
    FAIL("no error merging into " << output);
  } catch (const InputError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find('\n') == std::string::npos);
    for (const std::string& f : fragments) CHECK(msg.find(f) != std::string::npos);
  }
}

bool is_iso_utc(const std::string& s) {
  static const std::regex re(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)");
  return std::regex_match(s, re);
}

TEST_CASE("results db: runs round-trip with start and finish times", "[results]") {
  const std::string path = temp_path("runs.db");
  {
    auto db = ResultsDb::open(path);
    CHECK(db->path() == path);
    RunRecord a = make_run("{\"a\": \"it's \\\"quoted\\\"\\n\"}");
    a.command_line = "kvbench run --task 'x; DROP TABLE runs; --'\nsecond line";
    a.host = "h\xc3\xa9te \xf0\x9f\x9a\x80";
    const int64_t id_a = db->begin_run(a);
    const int64_t id_b = db->begin_run(make_run());
    CHECK(id_a != id_b);
    db->finish_run(id_a);
    CHECK_THROWS_AS(db->finish_run(id_b + 100), std::logic_error);

    const auto runs = db->runs();
    REQUIRE(runs.size() == 2);
    CHECK(runs[0].id == id_a);
    CHECK(runs[1].id == id_b);
    CHECK(runs[0].kvbench_version == a.kvbench_version);
    CHECK(runs[0].git_sha == a.git_sha);
    CHECK(runs[0].model_path == a.model_path);
    CHECK(runs[0].model_sha256 == a.model_sha256);
    CHECK(runs[0].host == a.host);
    CHECK(runs[0].command_line == a.command_line);
    CHECK(runs[0].config_json == a.config_json);
    CHECK(is_iso_utc(runs[0].started_at));
    CHECK(is_iso_utc(runs[0].finished_at));
    CHECK(runs[0].finished_at >= runs[0].started_at);
    CHECK(is_iso_utc(runs[1].started_at));
    CHECK(runs[1].finished_at.empty());
  }
  Raw raw(path);
  CHECK(raw.integer("SELECT count(*) FROM runs WHERE finished_at IS NULL") == 1);
}

TEST_CASE("results db: units round-trip exactly, NULLs as nullopt", "[results]") {
  const std::string path = temp_path("units.db");
  UnitRecord odd = make_unit("retr_kv|0|snapkv|budget=256|multi-turn|7");
  odd.task = "multihop_vt[hops=2]";
  odd.sample_id = std::string("quote ' double \" back \\ nul-free \t tab");
  odd.method = "h2o:recent=0.25";
  odd.budget = "";
  odd.mode = "multi-request";
  odd.seed = std::numeric_limits<uint64_t>::max();
  odd.context_tokens = int64_t{1} << 31;  // the largest a db may hold
  odd.context_prefill_ms = std::nextafter(1.0, 2.0);
  odd.head_tokens = {{int64_t{1} << 53}, {1}, {0}};
  odd.head_tokens_seen = int64_t{1} << 53;
  TurnRow& t = odd.turns[0];
  t.query = "line one\nline two\r\n\xe4\xb8\xad\xe6\x96\x87 '; DROP TABLE results; --";
  t.prediction = std::string("half a character \xe4\xb8 then \xff\xfe bytes");
  t.prediction += std::string("\0embedded", 9);  // even a NUL survives
  t.reference = "";
  t.prompt_tokens = 0;
  t.kv_bytes = (int64_t{1} << 52) + 12345;
  t.ttft_ms = 0.1 + 0.2;
  t.tpot_ms = std::numeric_limits<double>::denorm_min();
  t.prefill_tokens_per_s = 1e12;  // the bounds a db may hold
  t.decode_tokens_per_s = 0;
  t.tokens_kept = 0;
  t.first_token_kl = std::nullopt;
  t.top1_agreement = std::nullopt;
  t.score = std::nullopt;
  odd.turns[1].score = 0.0;  // present and zero is not null
  odd.turns[1].first_token_kl = 1e-300;

  UnitRecord plain = make_unit("u2", "full", 3);
  plain.seed = 0;
  plain.head_tokens.clear();  // not recorded: stays empty
  plain.head_tokens_seen = 0;
  int64_t run_id = 0;
  {
    auto db = ResultsDb::open(path);
    run_id = db->begin_run(make_run());
    db->write_unit(run_id, odd);
    db->write_unit(run_id, plain);
    const auto units = db->units();
    REQUIRE(units.size() == 2);
    require_same_unit(units[0], odd);
    require_same_unit(units[1], plain);
    CHECK(units[0].run_id == run_id);
  }
  // And after a reopen, read-only.
  auto db = ResultsDb::open(path, /*read_only=*/true);
  const auto units = db->units();
  REQUIRE(units.size() == 2);
  require_same_unit(units[0], odd);
  require_same_unit(units[1], plain);
  CHECK(units[1].run_id == run_id);
  CHECK_FALSE(units[1].turns[1].first_token_kl == std::nullopt);
  CHECK(units[0].turns[0].score == std::nullopt);
  CHECK(units[0].turns[1].score == 0.0);
  // A read-only db cannot be written.
  CHECK_THROWS(db->write_unit(run_id, make_unit("u3")));
}

TEST_CASE("results db: results rows are self-describing for plain SQL", "[results]") {
  const std::string path = temp_path("sql.db");
  {
    auto db = ResultsDb::open(path);
    const int64_t run = db->begin_run(make_run());
    db->write_unit(run, make_unit("a", "snapkv", 2));  // scores 0, 1
    db->write_unit(run, make_unit("b", "full", 2));
    UnitRecord c = make_unit("c", "full", 1);
    c.turns[0].score = std::nullopt;
    db->write_unit(run, c);
  }
  Raw raw(path);
  CHECK(raw.integer("SELECT count(*) FROM results") == 5);
  CHECK(raw.integer("SELECT count(*) FROM results WHERE score IS NULL") == 1);
  CHECK(raw.text("SELECT method || ':' || avg(score) FROM results WHERE method = 'snapkv' "
                 "GROUP BY method") == "snapkv:0.5");
  CHECK(raw.text("SELECT task || '|' || sample_id || '|' || turn || '|' || budget || '|' || "
                 "mode || '|' || seed || '|' || run_id FROM results ORDER BY id LIMIT 1") ==
        "retr_kv|retr_kv-a|1|budget=256|multi-turn|7|1");
  CHECK(raw.text("SELECT unit_key FROM units ORDER BY id DESC LIMIT 1") == "c");
  CHECK(is_iso_utc(raw.text("SELECT finished_at FROM units LIMIT 1")));
}

TEST_CASE("results db: finished_unit_keys lists what was written", "[results]") {
  auto db = ResultsDb::open(temp_path("keys.db"));
  CHECK(db->finished_unit_keys().empty());
  const int64_t run = db->begin_run(make_run());
  db->write_unit(run, make_unit("k1"));
  db->write_unit(run, make_unit("k2 with space"));
  db->write_unit(run, make_unit("k3", "full", 0));  // a unit without turns is still a unit
  CHECK(db->finished_unit_keys() == std::set<std::string>{"k1", "k2 with space", "k3"});
}

TEST_CASE("results db: a duplicate unit key is a logic_error, the first stays intact",
          "[results]") {
  auto db = ResultsDb::open(temp_path("dup.db"));
  const int64_t run = db->begin_run(make_run());
  const UnitRecord first = make_unit("the-key", "snapkv", 2);
  db->write_unit(run, first);
  UnitRecord second = make_unit("the-key", "full", 3);
  try {
    db->write_unit(run, second);
    FAIL("duplicate accepted");
  } catch (const std::logic_error& e) {
    CHECK(std::string(e.what()).find("the-key") != std::string::npos);
  }
  const auto units = db->units();
  REQUIRE(units.size() == 1);
  require_same_unit(units[0], first);
}

TEST_CASE("results db: a unit whose write fails half-way leaves no rows", "[results]") {
  const std::string path = temp_path("rollback.db");
  {
    auto db = ResultsDb::open(path);
    const int64_t run = db->begin_run(make_run());
    db->write_unit(run, make_unit("before"));
    UnitRecord bad = make_unit("bad", "snapkv", 3);
    bad.turns[2].turn = 1;  // violates UNIQUE(unit_id, turn) at the third insert
    CHECK_THROWS(db->write_unit(run, bad));
    CHECK(db->finished_unit_keys() == std::set<std::string>{"before"});
    CHECK(db->units().size() == 1);
    // An unknown run violates the foreign key: nothing written either.
    CHECK_THROWS(db->write_unit(run + 99, make_unit("orphan")));
    // NaN cannot be stored in a NOT NULL column: refused before anything is written.
    UnitRecord nan = make_unit("nan");
    nan.turns[1].tpot_ms = std::nan("");
    CHECK_THROWS_WITH(db->write_unit(run, nan), Catch::Contains("tpot_ms"));
    nan = make_unit("nan");
    nan.turns[0].attn_flops = std::nan("");
    CHECK_THROWS_WITH(db->write_unit(run, nan), Catch::Contains("attn_flops"));
    // The connection is usable and the key free after the rollback.
    db->write_unit(run, make_unit("bad"));
    CHECK(db->finished_unit_keys() == std::set<std::string>{"before", "bad"});
  }
  Raw raw(path);
  CHECK(raw.integer("SELECT count(*) FROM units") == 2);
  CHECK(raw.integer("SELECT count(*) FROM results") == 4);
  CHECK(raw.integer("SELECT count(*) FROM results WHERE unit_id NOT IN (SELECT id FROM units)") ==
        0);
}

TEST_CASE("results db: WAL mode, schema version 9, the four tables", "[results]") {
  const std::string path = temp_path("schema.db");
  auto db = ResultsDb::open(path);
  Raw raw(path);
  CHECK(raw.text("PRAGMA journal_mode") == "wal");
  CHECK(raw.integer("PRAGMA user_version") == kResultsSchemaVersion);
  CHECK(kResultsSchemaVersion == 9);
  for (const char* table : {"runs", "units", "results", "serving"}) {
    INFO(table);
    CHECK(raw.integer(std::string("SELECT count(*) FROM sqlite_master WHERE type = 'table' "
                                  "AND name = '") +
                      table + "'") == 1);
  }
  // Optional columns are nullable, the rest are not.
  CHECK(raw.integer("SELECT \"notnull\" FROM pragma_table_info('results') "
                    "WHERE name = 'score'") == 0);
  CHECK(raw.integer("SELECT \"notnull\" FROM pragma_table_info('results') "
                    "WHERE name = 'ttft_ms'") == 1);
  CHECK(raw.integer("SELECT \"notnull\" FROM pragma_table_info('runs') "
                    "WHERE name = 'finished_at'") == 0);
}

TEST_CASE("results db: serving rows are written, read back and merged", "[results]") {
  const std::string path = temp_path("serving.db");
  std::remove(path.c_str());
  {
    auto db = ResultsDb::open(path);
    RunRecord run;
    run.config_json = "{\"serving\":1}";
    const int64_t id = db->begin_run(run);
    ServingRow a;
    a.label = "kvbench serve";
    a.endpoint = "http://127.0.0.1:8080";
    a.method = "kivi:bits=4";
    a.concurrency = 4;
    a.pool_bytes = 1 << 20;
    a.task = "retr_kv";
    a.sample_id = "s0";
    a.turn = 2;
    a.start_s = 0.5;
    a.ttft_ms = 12.5;
    a.itl_ms = 3.25;
    a.e2e_ms = 40;
    a.prompt_tokens = 100;
    a.output_tokens = 9;
    a.cached_tokens = 64;
    a.prediction = "p";
    a.reference = "r";
    a.score = 1.0;
    ServingRow b = a;
    b.turn = 3;
    b.score.reset();
    b.error = "HTTP 503";
    db->write_serving(id, {a, b});
    db->finish_run(id);
  }
  const auto rows = ResultsDb::open(path, true)->serving_rows();
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].method == "kivi:bits=4");
  CHECK(rows[0].concurrency == 4);
  CHECK(rows[0].cached_tokens == 64);
  CHECK(rows[0].itl_ms == 3.25);
  CHECK(*rows[0].score == 1.0);
  CHECK_FALSE(rows[1].score);
  CHECK(rows[1].error == "HTTP 503");
  const std::string merged = temp_path("serving_merged.db");
  std::remove(merged.c_str());
  merge_results({path}, merged);
  CHECK(ResultsDb::open(merged, true)->serving_rows().size() == 2);
}

TEST_CASE("results db: a db that lies is refused before it is believed", "[results]") {
  const auto fresh = [](const std::string& name) {
    const std::string path = temp_path(name);
    std::remove(path.c_str());
    auto db = ResultsDb::open(path);
    const int64_t run = db->begin_run(make_run());
    db->write_unit(run, make_unit("u1"));
    db->finish_run(run);
    return path;
  };
  const auto refused = [](const std::string& path, const std::string& fragment) {
    for (const bool read_only : {true, false}) {
      try {
        ResultsDb::open(path, read_only)->units();
        FAIL("believed " << path);
      } catch (const InputError& e) {
        INFO(e.what());
        CHECK(std::string(e.what()).find(fragment) != std::string::npos);
      }
    }
  };
  // A trigger that deletes what a sweep writes made it report units it had not kept.
  const std::string trigger = fresh("lie_trigger.db");
  Raw(trigger).exec("CREATE TRIGGER eat AFTER INSERT ON results BEGIN DELETE FROM results; END");
  refused(trigger, "holds a trigger 'eat' kvbench did not make");
  const std::string view = fresh("lie_view.db");
  Raw(view).exec("CREATE VIEW everything AS SELECT * FROM results");
  refused(view, "holds a view 'everything'");
  // A unit without turns, and a forged turn far past a unit's own.
  const std::string empty = fresh("lie_no_turns.db");
  Raw(empty).exec("DELETE FROM results");
  refused(empty, "has no turns");
  const std::string far = fresh("lie_far_turn.db");
  Raw(far).exec("UPDATE results SET turn = 100000 WHERE turn = 2");
  refused(far, "turn 100000 follows 1 turns");
}

TEST_CASE("results db: a merge whose input is its own partial file refuses and keeps it",
          "[results]") {
  const std::string output = temp_path("partial_out.db");
  const std::string input = output + ".partial";
  std::remove(output.c_str());
  {
    auto db = ResultsDb::open(input);
    const int64_t run = db->begin_run(make_run());
    db->write_unit(run, make_unit("u1"));
    db->finish_run(run);
  }
  require_merge_error({input}, output, {"is also an input"});
  CHECK(ResultsDb::open(input, true)->units().size() == 1);  // it was removed before
  CHECK_FALSE(std::filesystem::exists(output));
}

TEST_CASE("results db: an empty file or empty SQLite db gets the schema", "[results]") {
  const std::string empty_file = temp_path("empty.db");
  write_file(empty_file, {});
  ResultsDb::open(empty_file);
  CHECK(Raw(empty_file).integer("PRAGMA user_version") == kResultsSchemaVersion);

  const std::string empty_db = temp_path("empty_sqlite.db");
  Raw(empty_db).exec("PRAGMA page_size = 4096; VACUUM");
  ResultsDb::open(empty_db)->begin_run(make_run());
  CHECK(Raw(empty_db).integer("SELECT count(*) FROM runs") == 1);

  // Read-only, an empty file is not a results db.
  const std::string empty_ro = temp_path("empty_ro.db");
  write_file(empty_ro, {});
  require_open_error(empty_ro, true, "not a kvbench results db");
}

TEST_CASE("results db: reopen an existing db and append", "[results]") {
  const std::string path = temp_path("append.db");
  {
    auto db = ResultsDb::open(path);
    const int64_t run = db->begin_run(make_run());
    db->write_unit(run, make_unit("u1"));
    db->finish_run(run);
  }
  {
    auto db = ResultsDb::open(path);
    CHECK(db->finished_unit_keys() == std::set<std::string>{"u1"});
    const int64_t run = db->begin_run(make_run());
    db->write_unit(run, make_unit("u2"));
    CHECK_THROWS_AS(db->write_unit(run, make_unit("u1")), std::logic_error);
  }
  auto db = ResultsDb::open(path);
  const auto runs = db->runs();
  REQUIRE(runs.size() == 2);
  const auto units = db->units();
  REQUIRE(units.size() == 2);
  CHECK(units[0].key == "u1");
  CHECK(units[0].run_id == runs[0].id);
  CHECK(units[1].key == "u2");
  CHECK(units[1].run_id == runs[1].id);
  CHECK(Raw(path).integer("PRAGMA user_version") == kResultsSchemaVersion);
}

TEST_CASE("results db: unwritable paths are one-line input errors", "[results]") {
  require_open_error(temp_path("no_such_dir") + "/results.db", false,
                     "cannot open the results db for writing");
  require_open_error(temp_path("missing_ro.db"), true, "cannot open the results db for reading");

  const std::string file = temp_path("a_file");
  write_file(file, {'x'});
  require_open_error(file + "/results.db", false, "cannot open the results db for writing");

  if (geteuid() == 0) {
    WARN("running as root: permission checks skipped");
    return;
  }
  const std::string dir = temp_path("ro_dir");
  REQUIRE(mkdir(dir.c_str(), 0555) == 0);
  require_open_error(dir + "/results.db", false, "cannot open the results db for writing");

  const std::string ro_file = temp_path("ro_file.db");
  ResultsDb::open(ro_file);
  REQUIRE(chmod(ro_file.c_str(), 0444) == 0);
  require_open_error(ro_file, false, "cannot open the results db for writing");
  CHECK(ResultsDb::open(ro_file, true)->units().empty());
}

TEST_CASE("results db: a file that is not a results db", "[results]") {
  const std::string garbage = temp_path("garbage.db");
  std::vector<uint8_t> bytes(4096);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>((i * 131) ^ 0x5a);
  write_file(garbage, bytes);
  require_open_error(garbage, false, "not a kvbench results db");
  require_open_error(garbage, true, "not a kvbench results db");
  CHECK(testing::read_file_bytes(garbage) == bytes);  // left alone

  const std::string other = temp_path("other.db");
  Raw(other).exec("CREATE TABLE t(x)");
  require_open_error(other, false, "not a kvbench results db");

  const std::string missing_table = temp_path("missing_table.db");
  ResultsDb::open(missing_table);
  Raw(missing_table).exec("DROP TABLE results");
  require_open_error(missing_table, false, "not a kvbench results db (no table results)");
}

TEST_CASE("results db: a schema newer than this kvbench", "[results]") {
  const std::string path = temp_path("newer.db");
  Raw(path).exec("CREATE TABLE runs(id); PRAGMA user_version = 99");
  require_open_error(path, false, "results db schema version 99 is newer than this kvbench");
  require_open_error(path, true, "use a newer kvbench");
  CHECK(Raw(path).integer("PRAGMA user_version") == 99);  // not touched
}

TEST_CASE("results db: locked by another process", "[results]") {
  const std::string path = temp_path("locked.db");
  auto db = ResultsDb::open(path);
  const int64_t run = db->begin_run(make_run());
  Raw other(path);
  other.exec("BEGIN EXCLUSIVE");
  other.exec("INSERT INTO runs (kvbench_version, git_sha, model_path, model_sha256, host, "
             "command_line, config_json, started_at) VALUES ('', '', '', '', '', '', '', '')");
  const auto start = std::chrono::steady_clock::now();
  require_open_error(path, false, "the results db is locked by another process");
  // A busy timeout, not an immediate failure.
  CHECK(std::chrono::steady_clock::now() - start > std::chrono::seconds(2));
  // Readers are not blocked by a writer in WAL mode.
  CHECK(ResultsDb::open(path, true)->runs().size() == 1);
  try {
    db->write_unit(run, make_unit("u"));
    FAIL("write while locked");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == path + ": the results db is locked by another process");
  }
  other.exec("ROLLBACK");
  db->write_unit(run, make_unit("u"));
  CHECK(db->finished_unit_keys().size() == 1);
}

// A shard db with the given units, each under one run.
void make_shard(const std::string& path, const std::vector<std::string>& keys,
                const std::string& config = R"({"methods":["full"]})",
                const std::string& model = std::string(64, 'a')) {
  auto db = ResultsDb::open(path);
  const int64_t run = db->begin_run(make_run(config, model));
  for (const std::string& key : keys) db->write_unit(run, make_unit(key, "m-" + key, 2));
  db->finish_run(run);
}

TEST_CASE("results db: merge joins shards into a new db", "[results]") {
  const std::string a = temp_path("shard_a.db");
  const std::string b = temp_path("shard_b.db");
  make_shard(a, {"a1", "a2"});
  make_shard(b, {"b1"});
  {  // A second run in shard b (a resumed sweep), with one more unit.
    auto db = ResultsDb::open(b);
    const int64_t run = db->begin_run(make_run());
    db->write_unit(run, make_unit("b2", "m-b2", 1));
  }
  const std::string out = temp_path("merged.db");
  merge_results({a, b}, out);

  auto merged = ResultsDb::open(out, true);
  const auto runs = merged->runs();
  REQUIRE(runs.size() == 3);
  CHECK_FALSE(runs[0].finished_at.empty());
  CHECK(runs[2].finished_at.empty());
  const auto run_a = ResultsDb::open(a, true)->runs();
  CHECK(runs[0].started_at == run_a[0].started_at);
  CHECK(runs[0].command_line == run_a[0].command_line);
  const auto units = merged->units();
  REQUIRE(units.size() == 4);
  CHECK(merged->finished_unit_keys() == std::set<std::string>{"a1", "a2", "b1", "b2"});
  CHECK(units[0].run_id == runs[0].id);
  CHECK(units[2].key == "b1");
  CHECK(units[2].run_id == runs[1].id);
  CHECK(units[3].key == "b2");
  CHECK(units[3].run_id == runs[2].id);
  require_same_unit(units[0], make_unit("a1", "m-a1", 2));
  require_same_unit(units[3], make_unit("b2", "m-b2", 1));
  Raw raw(out);
  CHECK(raw.integer("SELECT count(*) FROM results") == 7);
  CHECK(raw.integer("SELECT count(*) FROM results r JOIN units u ON r.unit_id = u.id "
                    "WHERE r.run_id != u.run_id") == 0);
  // The finish time of a unit is copied, not re-stamped.
  CHECK(raw.text("SELECT finished_at FROM units WHERE unit_key = 'a1'") ==
        Raw(a).text("SELECT finished_at FROM units WHERE unit_key = 'a1'"));
}

TEST_CASE("results db: merge refuses different configs or models, leaves no output",
          "[results]") {
  const std::string a = temp_path("cfg_a.db");
  const std::string b = temp_path("cfg_b.db");
  const std::string c = temp_path("cfg_c.db");
  make_shard(a, {"a1"});
  make_shard(b, {"b1"}, R"({"methods":["snapkv"]})");
  make_shard(c, {"c1"}, R"({"methods":["full"]})", std::string(64, 'b'));
  const std::string out = temp_path("cfg_out.db");
  require_merge_error({a, b}, out, {b + ": ", a, "config"});
  CHECK_FALSE(exists(out));
  require_merge_error({a, c}, out, {c + ": ", a, "model"});
  CHECK_FALSE(exists(out));
  CHECK_FALSE(exists(out + "-wal"));
  CHECK_FALSE(exists(out + "-shm"));
}

TEST_CASE("results db: merge refuses shards of two commits unless told, and the report lists them",
          "[results]") {
  const std::string a = temp_path("commit_a.db");
  const std::string b = temp_path("commit_b.db");
  make_shard(a, {"a1", "a2"});  // commit deadbeef
  {
    auto db = ResultsDb::open(b);
    RunRecord run = make_run();
    run.git_sha = "c0ffee123456-dirty";
    const int64_t id = db->begin_run(run);
    db->write_unit(id, make_unit("b1", "m-b1", 2));
    db->finish_run(id);
    // A later resume with nothing to run: an empty run of a third commit, which holds no
    // unit and so does not count.
    RunRecord later = make_run();
    later.git_sha = "feedface";
    db->finish_run(db->begin_run(later));
  }
  const std::string out = temp_path("commit_out.db");
  require_merge_error({a, b}, out, {b + ": run 1", "c0ffee123456-dirty", a + "'s by deadbeef",
                                    "--allow-mixed-commits"});
  CHECK_FALSE(exists(out));
  merge_results({a, b}, out, /*allow_mixed_commits=*/true);
  const auto runs = ResultsDb::open(out, true)->runs();
  REQUIRE(runs.size() == 3);
  CHECK(runs[0].units == 2);
  CHECK(runs[1].units == 1);
  CHECK(runs[2].units == 0);
  const std::string md = render_leaderboard_markdown(runs, {});
  CHECK(md.find("- git sha: MIXED: c0ffee123456-dirty (1 unit), deadbeef (2 units)\n") !=
        std::string::npos);
}

TEST_CASE("results db: merge refuses a unit key in two inputs", "[results]") {
  const std::string a = temp_path("dup_a.db");
  const std::string b = temp_path("dup_b.db");
  make_shard(a, {"a1", "shared-key"});
  make_shard(b, {"b1", "shared-key"});
  const std::string out = temp_path("dup_out.db");
  require_merge_error({a, b}, out, {"shared-key", a, b});
  CHECK_FALSE(exists(out));
}

TEST_CASE("results db: merge refuses an existing output or a bad input", "[results]") {
  const std::string a = temp_path("ex_a.db");
  make_shard(a, {"a1"});
  const std::string out = temp_path("ex_out.db");
  write_file(out, {'k', 'e', 'e', 'p'});
  require_merge_error({a}, out, {out + ": exists; merge writes a new db"});
  CHECK(testing::read_file_bytes(out) == std::vector<uint8_t>{'k', 'e', 'e', 'p'});

  const std::string out2 = temp_path("ex_out2.db");
  const std::string garbage = temp_path("ex_garbage.db");
  write_file(garbage, std::vector<uint8_t>(2048, 0x41));
  require_merge_error({a, garbage}, out2, {garbage + ": not a kvbench results db"});
  require_merge_error({a, temp_path("ex_missing.db")}, out2, {"ex_missing.db: cannot open"});
  CHECK_FALSE(exists(out2));
  CHECK_THROWS_AS(merge_results({}, out2), InputError);
  CHECK_FALSE(exists(out2));
  // An input that fails only while being copied (a unit naming a run that is not there,
  // written with foreign keys off): the partial output is removed.
  const std::string broken = temp_path("ex_broken.db");
  make_shard(broken, {"z1"});
  Raw(broken).exec("UPDATE units SET run_id = 42; UPDATE results SET run_id = 42");
  require_merge_error({a, broken}, out2, {broken + ": unit z1 names run 42"});
  CHECK_FALSE(exists(out2));
  CHECK_FALSE(exists(out2 + "-wal"));
  CHECK_FALSE(exists(out2 + "-shm"));
  // The same input twice has every key twice.
  require_merge_error({a, a}, out2, {"a1"});
  CHECK_FALSE(exists(out2));
}

TEST_CASE("results db: a version 1 db migrates to the current version and keeps its rows",
          "[results]") {
  const std::string path = temp_path("migrate_v1.db");
  {
    auto db = ResultsDb::open(path);
    const int64_t run = db->begin_run(make_run());
    db->write_unit(run, make_unit("u1"));
    db->finish_run(run);
  }
  // Back to what version 1 wrote: none of the columns later versions added.
  Raw(path).exec(
      "ALTER TABLE results DROP COLUMN kv_read_per_step; ALTER TABLE results DROP COLUMN "
      "tokens_reused; ALTER TABLE results DROP COLUMN reuse_bytes_loaded; ALTER TABLE results "
      "DROP COLUMN reuse_load_ms; ALTER TABLE results DROP COLUMN reuse_tiers; ALTER TABLE "
      "results DROP COLUMN reuse_faults; ALTER TABLE units DROP COLUMN prefill; ALTER TABLE "
      "units DROP COLUMN shared_prefill; ALTER TABLE units DROP COLUMN prefilled_tokens; "
      "ALTER TABLE units DROP COLUMN head_tokens; ALTER TABLE units DROP COLUMN "
      "head_tokens_seen; ALTER TABLE units DROP COLUMN query_setting; ALTER TABLE units DROP "
      "COLUMN turn_gap_s; ALTER TABLE results DROP COLUMN attn_flops; ALTER TABLE results DROP "
      "COLUMN attn_flops_dense; ALTER TABLE results DROP COLUMN retrieval_recall; "
      "DROP TABLE serving; ALTER TABLE units DROP COLUMN wall_ms; ALTER TABLE units DROP "
      "COLUMN shared_forward_ms; ALTER TABLE units DROP COLUMN reference_ms; "
      "ALTER TABLE units DROP COLUMN method_family; ALTER TABLE units DROP COLUMN "
      "method_series; ALTER TABLE units DROP COLUMN budget_tokens; "
      "PRAGMA user_version = 1");
  CHECK(Raw(path).integer("SELECT count(*) FROM pragma_table_info('results') "
                          "WHERE name = 'kv_read_per_step'") == 0);
  auto db = ResultsDb::open(path);
  CHECK(Raw(path).integer("PRAGMA user_version") == kResultsSchemaVersion);
  const auto units = db->units();
  REQUIRE(units.size() == 1);
  REQUIRE(!units[0].turns.empty());
  CHECK(units[0].turns[0].kv_read_per_step == 0);
  CHECK(units[0].turns[0].tokens_reused == 0);
  CHECK(units[0].turns[0].reuse_tiers.empty());
  CHECK(units[0].prefill.empty());  // unknown before v4
  CHECK_FALSE(units[0].shared_prefill);
  CHECK(units[0].head_tokens.empty());  // unknown before v5
  CHECK(units[0].query_setting.empty());  // unknown before v6
  CHECK(units[0].turn_gap_s == 0);
  CHECK(units[0].wall_ms == 0);  // unknown before v8
  CHECK(units[0].reference_ms == 0);
  CHECK(units[0].turns[0].attn_flops == 0);
  CHECK_FALSE(units[0].turns[0].retrieval_recall.has_value());
  CHECK(units[0].parts.family == "snapkv");  // v9's columns, filled from the spec
  CHECK(units[0].parts.series == "snapkv");
  const int64_t run = db->begin_run(make_run());
  UnitRecord u = make_unit("u2");
  u.turns[0].kv_read_per_step = 12345;
  u.prefill = "stream:128";
  u.shared_prefill = true;
  u.prefilled_tokens = 777;
  db->write_unit(run, u);
  const UnitRecord back = db->units()[1];
  CHECK(back.turns[0].kv_read_per_step == 12345);
  CHECK(back.prefill == "stream:128");
  CHECK(back.shared_prefill);
  CHECK(back.prefilled_tokens == 777);
}

TEST_CASE("results db: head tokens per layer and KV head, one JSON array per unit",
          "[results]") {
  const std::string path = temp_path("head_tokens.db");
  int64_t run = 0;
  {
    auto db = ResultsDb::open(path);
    run = db->begin_run(make_run());
    db->write_unit(run, make_unit("u1"));
    // Layers of different head counts are refused before anything is written.
    UnitRecord uneven = make_unit("uneven");
    uneven.head_tokens = {{1, 2}, {3}};
    CHECK_THROWS_WITH(db->write_unit(run, uneven), Catch::Contains("head_tokens"));
    uneven.head_tokens = {{}};
    CHECK_THROWS_AS(db->write_unit(run, uneven), std::invalid_argument);
    CHECK(db->finished_unit_keys() == std::set<std::string>{"u1"});
  }
  {
    // In the units row, next to the unit it belongs to: plain SQL reads it with json_extract.
    Raw raw(path);
    CHECK(raw.text("SELECT head_tokens FROM units") == "[[300,212],[256,256],[40,472]]");
    CHECK(raw.integer("SELECT json_extract(head_tokens, '$[2][1]') FROM units") == 472);
    CHECK(raw.integer("SELECT json_array_length(head_tokens) FROM units") == 3);
    CHECK(raw.integer("SELECT head_tokens_seen FROM units") == 600);
    // What SQL's json() writes reads back the same (whitespace allowed).
    raw.exec("UPDATE units SET head_tokens = '[ [300, 212], [256,256] ,[40,472] ] '");
  }
  CHECK(ResultsDb::open(path, true)->units()[0].head_tokens ==
        std::vector<std::vector<int64_t>>{{300, 212}, {256, 256}, {40, 472}});
  // A corrupt value is an InputError naming the db and the unit.
  for (const char* bad : {"[[1,2],[3]]", "[1,2]", "[[1,x]]", "[[1,2]", "[[]]", "[[1]] x",
                          "[[99999999999999999999]]", "[[-]]"}) {
    INFO(bad);
    Raw(path).exec(std::string("UPDATE units SET head_tokens = '") + bad + "'");
    try {
      ResultsDb::open(path, true)->units();
      FAIL("no error");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).rfind(path + ": ", 0) == 0);
      CHECK(std::string(e.what()).find("units.head_tokens of row 1: ") != std::string::npos);
    }
  }
}

TEST_CASE("results db: a version 8 db gets its specs' parts in columns, read or migrated",
          "[results]") {
  const std::string path = temp_path("migrate_v8.db");
  {
    auto db = ResultsDb::open(path);
    const int64_t run = db->begin_run(make_run());
    db->write_unit(run, make_unit("u1", "adakv:floor=0.2+snapkv:budget=96,window=32"));
    db->write_unit(run, make_unit("u2", "snapkv:ratio=0.5,window=8+kivi:bits=2"));
    db->write_unit(run, make_unit("u3", "full"));
    db->finish_run(run);
  }
  Raw(path).exec(
      "ALTER TABLE units DROP COLUMN method_family; ALTER TABLE units DROP COLUMN "
      "method_series; ALTER TABLE units DROP COLUMN budget_tokens; PRAGMA user_version = 8");
  for (const bool read_only : {true, false}) {
    INFO("read only: " << read_only);
    const auto units = ResultsDb::open(path, read_only)->units();
    REQUIRE(units.size() == 3);
    CHECK(units[0].parts.family == "adakv+snapkv");
    CHECK(units[0].parts.series == "adakv:floor=0.2+snapkv:window=32");
    CHECK(units[0].parts.budget_tokens == 96);
    CHECK(units[1].parts.family == "snapkv+kivi");
    CHECK(units[1].parts.series == "snapkv:window=8+kivi:bits=2");
    CHECK_FALSE(units[1].parts.budget_tokens.has_value());
    CHECK(units[2].parts.family == "full");
    CHECK(units[2].parts.series == "full");
  }
  CHECK(Raw(path).integer("PRAGMA user_version") == kResultsSchemaVersion);
}

TEST_CASE("results db: a version 4 db killed mid-sweep migrates and resumes", "[results]") {
  const std::string path = temp_path("migrate_v4.db");
  {
    auto db = ResultsDb::open(path);
    const int64_t run = db->begin_run(make_run());  // never finished: killed
    db->write_unit(run, make_unit("u1"));
  }
  Raw(path).exec(
      "ALTER TABLE units DROP COLUMN head_tokens; ALTER TABLE units DROP COLUMN "
      "head_tokens_seen; ALTER TABLE units DROP COLUMN query_setting; ALTER TABLE units DROP "
      "COLUMN turn_gap_s; ALTER TABLE results DROP COLUMN attn_flops; ALTER TABLE results DROP "
      "COLUMN attn_flops_dense; ALTER TABLE results DROP COLUMN retrieval_recall; "
      "DROP TABLE serving; ALTER TABLE units DROP COLUMN wall_ms; ALTER TABLE units DROP "
      "COLUMN shared_forward_ms; ALTER TABLE units DROP COLUMN reference_ms; "
      "ALTER TABLE units DROP COLUMN method_family; ALTER TABLE units DROP COLUMN "
      "method_series; ALTER TABLE units DROP COLUMN budget_tokens; "
      "PRAGMA user_version = 4");
  // Read-only, an older schema is read through a migrated copy in memory, the file as it was.
  {
    const std::string before = read_bytes(path);
    auto reader = ResultsDb::open(path, true);
    CHECK(reader->finished_unit_keys() == std::set<std::string>{"u1"});
    CHECK(reader->units().size() == 1);
    CHECK(Raw(path).integer("PRAGMA user_version") == 4);
    CHECK(read_bytes(path) == before);
  }
  auto db = ResultsDb::open(path);
  CHECK(Raw(path).integer("PRAGMA user_version") == kResultsSchemaVersion);
  CHECK(db->finished_unit_keys() == std::set<std::string>{"u1"});
  CHECK(db->runs()[0].finished_at.empty());
  const int64_t run = db->begin_run(make_run());
  db->write_unit(run, make_unit("u2"));
  const auto units = db->units();
  REQUIRE(units.size() == 2);
  CHECK(units[0].head_tokens.empty());  // written before v5
  CHECK(units[0].head_tokens_seen == 0);
  CHECK(units[0].query_setting.empty());  // written before v6
  CHECK(units[1].query_setting == "aware");
  CHECK(units[1].head_tokens == make_unit("u2").head_tokens);
  CHECK(units[1].head_tokens_seen == 600);
  // And through merge, both kinds of unit.
  const std::string merged = temp_path("migrate_v4_merged.db");
  std::remove(merged.c_str());
  merge_results({path}, merged);
  const auto back = ResultsDb::open(merged, true)->units();
  REQUIRE(back.size() == 2);
  require_same_unit(back[0], units[0]);
  require_same_unit(back[1], units[1]);
}

}  // namespace
}  // namespace kvbench
